"""A three-layer network for the tests of the run machinery (kills, resumes, sweeps, workers), where the model is
not the point: it builds and traces in a fraction of VGG19's time.

    python run.py model=custom model._target_=tiny_model.build     # with tests/ on PYTHONPATH
"""

from __future__ import annotations

import keras


def build(
    num_classes: int,
    input_shape: tuple[int, int, int],
    units: int = 16,
    dropout: float = 0.0,
    weight_decay: float = 0.0,
) -> keras.Model:
    """A conv, global pooling, a dense hidden layer (with dropout and L2, the keys the Optuna search sweeps) and the
    classifier (float32 softmax under mixed precision)."""
    regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu", kernel_regularizer=regularizer, name="tiny_conv")(
        inputs
    )
    x = keras.layers.GlobalAveragePooling2D(name="tiny_pool")(x)
    x = keras.layers.Dense(units, activation="relu", kernel_regularizer=regularizer, name="tiny_hidden")(x)
    x = keras.layers.Dropout(dropout, name="tiny_dropout")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="predictions")(x)
    return keras.Model(inputs, outputs, name="tiny")
