"""VGG19 for image classification, built with the Keras functional API.

Layer names follow `keras/src/applications/vgg19.py` (`block1_conv1` ...
`block5_pool`, `fc1`, `fc2`, `predictions`), so weights and summaries read
the same as Keras's own model. Exercised by `python run.py model=vgg19`.
"""

from __future__ import annotations

import keras
from keras import layers

from trainer.models import VGG19_MIN_INPUT

# Convolutions per block and their channels at width_multiplier=1.
BLOCKS = ((2, 64), (2, 128), (4, 256), (4, 512), (4, 512))
# He initialization: a 19-layer ReLU stack trained from scratch without batch
# norm does not learn from Glorot's smaller weights (Keras's default).
INITIALIZER = "he_normal"
MIN_INPUT_SIZE = VGG19_MIN_INPUT[0]  # five 2x2 "same" poolings take 16 down to 1


def dropout_layer(rate: float, name: str) -> layers.Dropout:
    """Dropout that computes in float32 whatever the precision policy. In bfloat16, TensorFlow's dropout draws
    its uniform numbers in bfloat16 (128 values) and rounds the rate and 1 / (1 - rate): at 0.3 it keeps 69.5%
    of the units and scales them by 1.4297, so activations come out 0.7% smaller in training than at
    inference, in every step of a `mixed_bfloat16` run (issue 52; ledger row 21 in docs/development.md). Its
    inputs are [batch, units]: the casts cost nothing next to a step."""
    return layers.Dropout(rate, dtype="float32", name=name)


def _check_args(num_classes, input_shape, width_multiplier, fc_units, dropout, weight_decay):
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2. Received: num_classes={num_classes}")
    if len(input_shape) != 3 or min(input_shape[:2]) < MIN_INPUT_SIZE:
        raise ValueError(
            f"input_shape must be (height, width, channels) with height and width >= {MIN_INPUT_SIZE}. "
            f"Received: input_shape={input_shape}"
        )
    if not 0 < width_multiplier <= 4:
        raise ValueError(f"width_multiplier must be in (0, 4]. Received: width_multiplier={width_multiplier}")
    if fc_units < 1:
        raise ValueError(f"fc_units must be >= 1. Received: fc_units={fc_units}")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0. Received: weight_decay={weight_decay}")


def build_vgg19(
    num_classes: int,
    input_shape: tuple[int, int, int] = (32, 32, 3),
    width_multiplier: float = 1.0,
    fc_units: int = 512,
    dropout: float = 0.5,
    weight_decay: float = 5e-4,
    batch_norm: bool = True,
    batch_norm_momentum: float = 0.9,
    synchronized_batch_norm: bool = False,
) -> keras.Model:
    """Builds VGG19: 16 3x3 convolutions in blocks of 2-2-4-4-4, then the classifier.

    The classifier pools globally after `block5_pool`, so one head suits a
    32x32 input (where block5 is already 1x1) and a 224x224 one (7x7).

    Args:
        num_classes: Number of output classes.
        input_shape: (height, width, channels) of the standardized input.
        width_multiplier: Scales every layer's channels; 0.125 makes a tiny test model.
        fc_units: Units in each of the two fully connected layers, before scaling.
        dropout: Dropout rate after `fc1` and `fc2`; 0 disables it.
        weight_decay: L2 factor on every conv and dense kernel.
        batch_norm: Adds batch normalization after each convolution and fully connected layer.
        batch_norm_momentum: Momentum of batch norm's moving statistics; Keras's 0.99 lags behind the
            weights for hundreds of steps, so short runs validate on stale statistics.
        synchronized_batch_norm: Batch norm computes its statistics over the global batch, all replicas of
            the distribution strategy together (TensorFlow backend), not over each replica's share; the
            training task sets it when training on more than one replica.

    Returns:
        An uncompiled `keras.Model` named `vgg19` whose output is softmax probabilities.
    """
    _check_args(num_classes, input_shape, width_multiplier, fc_units, dropout, weight_decay)
    if not 0 <= batch_norm_momentum < 1:
        raise ValueError(f"batch_norm_momentum must be in [0, 1). Received: batch_norm_momentum={batch_norm_momentum}")
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

    def batch_normalization(name: str) -> layers.BatchNormalization:
        return layers.BatchNormalization(momentum=batch_norm_momentum, synchronized=synchronized_batch_norm, name=name)

    def width(channels: int) -> int:
        return max(1, int(round(channels * width_multiplier)))

    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = inputs
    for block, (num_convs, channels) in enumerate(BLOCKS, start=1):
        # Block N: num_convs 3x3 convolutions, then 2x2 max pooling.
        for conv in range(1, num_convs + 1):
            name = f"block{block}_conv{conv}"
            x = layers.Conv2D(
                width(channels),
                3,
                padding="same",
                use_bias=not batch_norm,
                kernel_regularizer=regularizer,
                name=name,
            )(x)
            if batch_norm:
                x = batch_normalization(f"{name}_bn")(x)
            x = layers.Activation("relu", name=f"{name}_relu")(x)
        # "same" padding keeps odd sizes (a 28x28 crop) from shrinking to zero.
        x = layers.MaxPooling2D(2, strides=2, padding="same", name=f"block{block}_pool")(x)

    # Classifier
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    for index in (1, 2):
        x = layers.Dense(
            width(fc_units),
            kernel_initializer=INITIALIZER,
            kernel_regularizer=regularizer,
            name=f"fc{index}",
        )(x)
        if batch_norm:
            x = batch_normalization(f"fc{index}_bn")(x)
        x = layers.Activation("relu", name=f"fc{index}_relu")(x)
        if dropout:
            x = dropout_layer(dropout, f"fc{index}_dropout")(x)
    # Softmax in float32 keeps mixed-precision outputs stable.
    outputs = layers.Dense(
        num_classes,
        activation="softmax",
        kernel_regularizer=regularizer,
        dtype="float32",
        name="predictions",
    )(x)
    return keras.Model(inputs, outputs, name="vgg19")
