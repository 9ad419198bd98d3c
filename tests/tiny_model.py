"""A three-layer network for the tests of the run machinery (kills, resumes, sweeps, workers), where the model is
not the point: it builds and traces in a fraction of VGG19's time; and a callback that fails one worker.

    python run.py model=custom model._target_=tiny_model.build     # with tests/ on PYTHONPATH
    python run.py +callbacks.fail._target_=tiny_model.FailOnWorker +callbacks.fail.task_index=1 +callbacks.fail.epoch=2
"""

from __future__ import annotations

import json
import os
import time

import keras

from trainer.errors import DataError


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


class _OnWorker(keras.callbacks.Callback):
    """Acts at epoch `epoch` on the worker of TF_CONFIG's `task_index` alone."""

    def __init__(self, task_index: int, epoch: int) -> None:
        super().__init__()
        self.task_index, self.epoch = task_index, epoch

    def _chosen(self, epoch: int) -> bool:
        own = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
        return own == self.task_index and epoch + 1 == self.epoch


class FailOnWorker(_OnWorker):
    """Raises a `DataError` at the end of epoch `epoch` on the worker of TF_CONFIG's `task_index` alone, as a bad
    file in that worker's share would."""

    def on_epoch_end(self, epoch, logs=None):
        if self._chosen(epoch):
            raise DataError(f"worker {self.task_index} fails on purpose after epoch {self.epoch}")


class HangOnWorker(_OnWorker):
    """Sleeps for ever at the start of epoch `epoch` on the worker of TF_CONFIG's `task_index` alone, as a worker
    whose input hangs on a dead mount would: alive, sending heartbeats, never joining the next collective."""

    def on_epoch_begin(self, epoch, logs=None):
        while self._chosen(epoch):
            time.sleep(1)
