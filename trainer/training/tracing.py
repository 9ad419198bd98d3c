"""Each step function traced once: what a compiled model's first step would create is built before `fit`.

    python run.py          # "First training step done" comes one trace sooner

TensorFlow traces a `tf.function` again when its first trace created variables. Under a
distribution strategy Keras builds the optimizer's slots and the metrics' variables
symbolically before `fit`; under TensorFlow's default strategy (`strategy=single`) it leaves
them to the first trace, so VGG19's training and evaluation steps were each traced twice,
seconds apiece. `build_step_state` builds them first, with public Keras calls only.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def build_step_state(model: keras.Model, batch: tuple[tf.Tensor, tf.Tensor]) -> None:
    """Creates the metrics' variables (from one evaluation-mode call on `batch`, then reset) and the optimizer's
    slots of a compiled `model`; nothing trained changes. Under a strategy Keras does this itself."""
    if model.distribute_strategy is not tf.distribute.get_strategy():
        return
    images, labels = batch
    images = tf.cast(images, model.inputs[0].dtype)  # float32 for a model trained on MixUp's images
    model.compute_metrics(images, labels, model(images, training=False))
    model.reset_metrics()
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
