"""Keras callbacks for a training run: checkpoints, logs and the run folder's files.

python run.py   # writes checkpoints/, history.csv and tensorboard/ in the run folder
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import keras

from trainer.reports import write_atomic

log = logging.getLogger(__name__)


class Checkpoint(keras.callbacks.Callback):
    """Saves the whole model (`.keras`) at epoch end, atomically.

    With `monitor` set, saves only when that metric improves (`best.keras`);
    without, saves every epoch (`last.keras`).
    """

    def __init__(self, path: str | Path, monitor: str | None = None, mode: str = "max"):
        super().__init__()
        self.path = Path(path)
        self.monitor = monitor
        self.better = (lambda new, old: new > old) if mode == "max" else (lambda new, old: new < old)
        self.best = -math.inf if mode == "max" else math.inf

    def on_epoch_end(self, epoch, logs=None):
        if self.monitor is not None:
            value = (logs or {}).get(self.monitor)
            if value is None:
                raise ValueError(f"objective.metric={self.monitor!r} is not among the metrics {sorted(logs or {})}")
            if not self.better(value, self.best):
                return
            log.info("Epoch %d: %s improved to %.4f, saving %s", epoch + 1, self.monitor, value, self.path)
            self.best = value
        write_atomic(self.path, self.model.save)


class EpochLog(keras.callbacks.Callback):
    """Logs the first step (start-up cost) and one line per epoch to the run's log file."""

    def __init__(self):
        super().__init__()
        self.first_step_logged = False

    def on_train_batch_end(self, batch, logs=None):
        if not self.first_step_logged:
            self.first_step_logged = True
            log.info("First training step done")

    def on_epoch_end(self, epoch, logs=None):
        metrics = " ".join(f"{name}={value:.4f}" for name, value in sorted((logs or {}).items()))
        log.info("Epoch %d/%d: %s", epoch + 1, self.params.get("epochs", 0), metrics)


class LearningRateLog(keras.callbacks.Callback):
    """Adds the optimizer's current learning rate to the epoch logs (history.csv, TensorBoard)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class Curves(keras.callbacks.Callback):
    """Redraws curves.png from history.csv at every epoch end."""

    def __init__(self, history_csv: Path, path: Path):
        super().__init__()
        self.history_csv, self.path = history_csv, path

    def on_epoch_end(self, epoch, logs=None):
        from trainer.visualize import plot_curves

        plot_curves(self.history_csv, self.path)


class SampleImages(keras.callbacks.Callback):
    """Writes a few input images, as the model sees them, to TensorBoard once at the start."""

    def __init__(self, log_dir: Path, images, standardized: bool):
        super().__init__()
        self.log_dir, self.images, self.standardized = log_dir, images, standardized

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        from trainer.visualize import to_display

        with tf.summary.create_file_writer(str(self.log_dir / "train")).as_default():
            tf.summary.image("input_images", to_display(self.images, self.standardized), step=0, max_outputs=8)


def training_callbacks(
    run_dir: Path, monitor: str, mode: str, sample_images=None, standardized: bool = True
) -> list[keras.callbacks.Callback]:
    """The callbacks every run gets, writing into `run_dir`; order matters (the lr joins the logs first)."""
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    callbacks = [
        LearningRateLog(),
        Checkpoint(checkpoints / "best.keras", monitor=monitor, mode=mode),
        Checkpoint(checkpoints / "last.keras"),
        keras.callbacks.CSVLogger(str(run_dir / "history.csv"), append=True),
        Curves(run_dir / "history.csv", run_dir / "curves.png"),
        keras.callbacks.TensorBoard(str(run_dir / "tensorboard"), write_graph=False),
        EpochLog(),
    ]
    if sample_images is not None:
        callbacks.append(SampleImages(run_dir / "tensorboard", sample_images, standardized))
    return callbacks
