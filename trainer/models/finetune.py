"""VGG19 from ImageNet weights with a new head, and the layer freezing of two-phase fine-tuning.

    python run.py experiment=cats_dogs_finetune dataset.data_dir=records/
    python run.py model=vgg19_imagenet model.weights=/models/vgg19_notop.weights.h5   # no internet

The base is Keras's own `keras.applications.VGG19(include_top=False)`; its
layers keep their names (`block1_conv1` ... `block5_pool`) in the returned
model, so `finetune.unfreeze_from=block5_conv1` can name them. Inputs must be
preprocessed as the weights expect (`keras.applications.vgg19.preprocess_input`,
"caffe": BGR, mean-subtracted); the model's own `caffe_preprocess` layer does that
(`trainer.models.preprocessing`).
"""

from __future__ import annotations

import os

import keras
from keras import layers

from trainer.errors import ConfigError, DataError
from trainer.models.vgg19 import dropout_layer

BASE_PREFIX = "block"  # every layer of the convolutional base


def build_vgg19_imagenet(
    num_classes: int,
    input_shape: tuple[int, int, int] = (224, 224, 3),
    weights: str | None = "imagenet",
    fc_units: int = 256,
    dropout: float = 0.5,
    weight_decay: float = 1e-4,
) -> keras.Model:
    """VGG19's convolutional base with `weights`, then global pooling, fc1 (dropout, L2) and predictions.

    Args:
        num_classes: Classes of the new head.
        input_shape: (height, width, 3); at least 32x32.
        weights: "imagenet" (downloaded and cached by Keras), a local `.h5` / `.weights.h5` file of
            VGG19 without its top, or None for random weights.
        fc_units: Units of the new hidden layer.
        dropout: Dropout rate before the classifier.
        weight_decay: L2 factor on the new head's kernels.

    Raises:
        DataError: the weights file is missing or does not fit VGG19 without its top.
    """
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
    local = weights not in (None, "imagenet")
    if local and not os.path.isfile(weights):
        raise DataError(f"model.weights={weights}: no such file (expected VGG19 weights without the top, .h5)")
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    try:
        base = keras.applications.VGG19(include_top=False, weights=None if local else weights, input_tensor=inputs)
    except Exception as error:  # no internet, a blocked cache folder
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(
            f"model.weights={weights}: could not get the ImageNet weights ({reason}); without internet, download "
            "vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5 elsewhere and pass model.weights=/path/to/it"
        ) from None
    if local:
        try:
            base.load_weights(weights)
        except Exception as error:  # wrong layer count or kernel shapes
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(f"model.weights={weights}: does not match VGG19 without its top ({reason})") from None
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    x = layers.GlobalAveragePooling2D(name="avg_pool")(base.output)
    x = layers.Dense(fc_units, activation="relu", kernel_regularizer=regularizer, name="fc1")(x)
    if dropout:
        x = dropout_layer(dropout, "fc1_dropout")(x)
    outputs = layers.Dense(
        num_classes, activation="softmax", kernel_regularizer=regularizer, dtype="float32", name="predictions"
    )(x)
    return keras.Model(inputs, outputs, name="vgg19_imagenet")


def base_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The convolutional base's layers, also when the network is nested behind preprocessing layers."""
    from trainer.models.preprocessing import inner_layers

    return [layer for layer in inner_layers(model) if layer.name.startswith(BASE_PREFIX)]


def set_trainable(model: keras.Model, unfreeze_from: str | None) -> list[str]:
    """Freezes the base below `unfreeze_from` (a layer name, `all`, or None for the whole base).

    The head always trains. Returns the names of the base layers left trainable.

    Raises:
        ConfigError: `unfreeze_from` names no base layer.
    """
    base = base_layers(model)
    names = [layer.name for layer in base]
    if unfreeze_from is None:
        start = len(base)
    elif unfreeze_from == "all":
        start = 0
    elif unfreeze_from in names:
        start = names.index(unfreeze_from)
    else:
        raise ConfigError(
            f"finetune.unfreeze_from must be 'all' or a layer of the base, e.g. block5_conv1; "
            f"got {unfreeze_from!r} (layers: {', '.join(n for n in names if 'conv' in n)})"
        )
    for index, layer in enumerate(base):
        layer.trainable = index >= start
    return names[start:]
