"""Models: the VGG19 builders, the preprocessing and training wrapper around any network, serving signatures.

The smallest input side each built-in model takes is here, without Keras, so the
config can refuse a `dataset.image_size` that is too small before TensorFlow starts.
"""

TTA = ("none", "flip")  # evaluate.tta, predict.tta: trainer.models.tta

# (smallest input side, why) of each built-in model: its schema's MIN_INPUT (trainer.config.groups)
VGG19_MIN_INPUT = (16, "VGG19's five poolings")  # five 2x2 "same" poolings take 16 pixels down to 1
IMAGENET_VGG19_MIN_INPUT = (32, "Keras's ImageNet VGG19 base")  # keras.applications.VGG19 refuses anything smaller
