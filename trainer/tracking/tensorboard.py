"""TensorBoard beside Keras's own callback: the run's name and tags, and a few of the model's input images.

python run.py logger=tensorboard name=baseline tags=[digits]      # tensorboard --logdir outputs
"""

from __future__ import annotations

from pathlib import Path

import keras


class RunLabel(keras.callbacks.Callback):
    """Writes the run's name and tags to TensorBoard once, as text."""

    def __init__(self, log_dir: Path, name: str, tags: list[str]):
        super().__init__()
        self.log_dir, self.name, self.tags = log_dir, name, tags

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        with tf.summary.create_file_writer(str(self.log_dir / "train")).as_default():
            tf.summary.text("run/name", self.name, step=0)
            tf.summary.text("run/tags", ", ".join(self.tags) or "(none)", step=0)


class SampleImages(keras.callbacks.Callback):
    """Writes a few input images (the model's uint8 inputs) to TensorBoard once at the start."""

    def __init__(self, log_dir: Path, images):
        super().__init__()
        self.log_dir, self.images = log_dir, images

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        with tf.summary.create_file_writer(str(self.log_dir / "train")).as_default():
            tf.summary.image("input_images", self.images, step=0, max_outputs=8)
