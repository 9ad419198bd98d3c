"""TensorBoard: Keras's callback with epochs from 1, the run's name and tags, a few input images, the test figures.

python run.py logger=tensorboard name=baseline tags=[digits]      # tensorboard --logdir outputs
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

from trainer.runs.storage import join


class TensorBoard(keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback with the epochs numbered from 1, as history.csv, the log, MLflow and W&B
    number them (Keras's own starts at 0)."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)


def write_test_metrics(log_dir: str | os.PathLike, metrics: dict, step: int, sheets: list[Path] = ()) -> None:
    """The best checkpoint's test figures, as a `test` run beside Keras's `train` and `validation` ones (same
    tags, at the best epoch) in `log_dir` (a path or a gfile URL), so every run shows them, not only sweeps
    through HParams; and the PNG `sheets` (those that exist) as images."""
    import tensorflow as tf

    with tf.summary.create_file_writer(join(log_dir, "test")).as_default():
        for name in ("accuracy", "loss"):
            tf.summary.scalar(f"epoch_{name}", metrics[f"test_{name}"], step=step)
        for name in ("ece", "balanced_accuracy", "macro_f1"):
            if f"test_{name}" in metrics:
                tf.summary.scalar(f"epoch_{name}", metrics[f"test_{name}"], step=step)
        for sheet in sheets:  # the evaluation report's pictures (Images tab)
            if sheet.is_file():
                image = tf.io.decode_png(tf.io.read_file(str(sheet)), channels=3)
                tf.summary.image(f"report/{sheet.stem}", image[None], step=step)
        tf.summary.flush()


class RunLabel(keras.callbacks.Callback):
    """Writes the run's name and tags to TensorBoard once, as text, after the first training step: the text
    summary's first use imports TensorBoard's text plugin, which the start-up need not wait for."""

    def __init__(self, log_dir: str | os.PathLike, name: str, tags: list[str]):
        super().__init__()
        self.log_dir, self.name, self.tags = log_dir, name, tags
        self.written = False

    def on_train_batch_end(self, batch, logs=None):
        if self.written:
            return
        self.written = True
        import tensorflow as tf

        with tf.summary.create_file_writer(join(self.log_dir, "train")).as_default():
            tf.summary.text("run/name", self.name, step=0)
            tf.summary.text("run/tags", ", ".join(self.tags) or "(none)", step=0)


class SampleImages(keras.callbacks.Callback):
    """Writes a few input images (the model's uint8 inputs, as `images()` reads them) to TensorBoard once, after
    the first training step (as RunLabel: reading and writing them start in the first step's shadow)."""

    def __init__(self, log_dir: str | os.PathLike, images: Callable[[], np.ndarray]):
        super().__init__()
        self.log_dir, self.images = log_dir, images
        self.written = False

    def on_train_batch_end(self, batch, logs=None):
        if self.written:
            return
        self.written = True
        import tensorflow as tf

        with tf.summary.create_file_writer(join(self.log_dir, "train")).as_default():
            tf.summary.image("input_images", self.images(), step=0, max_outputs=8)
