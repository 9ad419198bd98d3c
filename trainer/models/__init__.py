"""Models: the VGG19 builders, the preprocessing and training wrapper around any network, serving signatures.

The smallest input side each built-in model takes is here, without Keras, so the
config can refuse a `dataset.image_size` that is too small before TensorFlow starts.
"""

TTA = ("none", "flip")  # evaluate.tta, predict.tta: trainer.models.tta

MIN_INPUT_SIZES = {  # model.name -> (smallest input side, why)
    "vgg19": (16, "VGG19's five poolings"),  # five 2x2 "same" poolings take 16 pixels down to 1
    "vgg19_imagenet": (32, "Keras's ImageNet VGG19 base"),  # keras.applications.VGG19 refuses anything smaller
}
