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
    """Logs one line per epoch to the run's log file."""

    def on_epoch_end(self, epoch, logs=None):
        metrics = " ".join(f"{name}={value:.4f}" for name, value in sorted((logs or {}).items()))
        log.info("Epoch %d/%d: %s", epoch + 1, self.params.get("epochs", 0), metrics)


def training_callbacks(run_dir: Path, monitor: str, mode: str) -> list[keras.callbacks.Callback]:
    """The callbacks every run gets, writing into `run_dir`."""
    checkpoints = run_dir / "checkpoints"
    return [
        Checkpoint(checkpoints / "best.keras", monitor=monitor, mode=mode),
        Checkpoint(checkpoints / "last.keras"),
        keras.callbacks.CSVLogger(str(run_dir / "history.csv"), append=True),
        keras.callbacks.TensorBoard(str(run_dir / "tensorboard"), write_graph=False),
        EpochLog(),
    ]
