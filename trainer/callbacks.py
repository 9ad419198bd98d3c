"""Keras callbacks for a training run: checkpoints, logs and the run folder's files.

python run.py   # writes checkpoints/, history.csv and tensorboard/ in the run folder
"""

from __future__ import annotations

import csv
import logging
import math
import shutil
import signal
import threading
import time
from pathlib import Path

import keras

from trainer import checkpoints
from trainer.backup import RunBackup
from trainer.errors import UserError
from trainer.reports import write_atomic

log = logging.getLogger(__name__)


class Checkpoints(keras.callbacks.Callback):
    """Saves the whole model with its `ModelInfo` to `last.keras` at every epoch end and copies it to
    `best.keras` when `monitor` improves; both atomic. Copying the file takes milliseconds, a second save ~0.2 s."""

    def __init__(
        self, folder: Path, info: checkpoints.ModelInfo, monitor: str, mode: str = "max", best: float | None = None
    ):
        super().__init__()
        self.info = info
        self.last, self.best_path = folder / "last.keras", folder / "best.keras"
        self.monitor = monitor
        self.better = (lambda new, old: new > old) if mode == "max" else (lambda new, old: new < old)
        self.best = best if best is not None else (-math.inf if mode == "max" else math.inf)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not all(math.isfinite(float(value)) for value in logs.values()):
            return  # never replace a good checkpoint with diverged weights
        value = logs.get(self.monitor)
        if value is None:
            raise ValueError(f"objective.metric={self.monitor!r} is not among the metrics {sorted(logs)}")
        write_atomic(self.last, lambda temporary: checkpoints.save(self.model, temporary, self.info))
        if self.better(value, self.best):
            log.info("Epoch %d: %s improved to %.4f, saving %s", epoch + 1, self.monitor, value, self.best_path)
            self.best = value
            write_atomic(self.best_path, lambda temporary: shutil.copyfile(self.last, temporary))


class EpochLog(keras.callbacks.Callback):
    """Logs the first step (start-up cost) and one line per epoch, the only one on the console and in run.log
    (`fit` runs with verbose=0)."""

    def __init__(self):
        super().__init__()
        self.first_step_logged = False
        self.started = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self.first_step_logged:
            self.first_step_logged = True
            log.info("First training step done")

    def on_epoch_end(self, epoch, logs=None):
        metrics = " ".join(f"{name}={value:.4g}" for name, value in sorted((logs or {}).items()))
        seconds = time.perf_counter() - self.started
        log.info("Epoch %d/%d: %s (%.1f s)", epoch + 1, self.params.get("epochs", 0), metrics, seconds)


class ProgressBar(keras.callbacks.Callback):
    """A progress bar within each epoch, for a terminal: it appears once an epoch has run `delay` seconds
    and is erased at the epoch end, where EpochLog's line takes its place."""

    def __init__(self, delay: float = 2.0):
        super().__init__()
        self.delay, self.bar = delay, None

    def on_epoch_begin(self, epoch, logs=None):
        from tqdm import tqdm

        description = f"Epoch {epoch + 1}/{self.params.get('epochs', 0)}"
        self.bar = tqdm(total=self.params.get("steps"), desc=description, unit="step", leave=False, delay=self.delay)

    def on_train_batch_end(self, batch, logs=None):
        if self.bar is not None:
            self.bar.update(batch + 1 - self.bar.n)  # with steps_per_execution > 1, called every N steps
            if logs and "loss" in logs:
                self.bar.set_postfix(loss=f"{float(logs['loss']):.4g}", refresh=False)

    def on_epoch_end(self, epoch, logs=None):
        self.on_train_end()

    def on_train_end(self, logs=None):  # also after a stop within an epoch
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Preempted(Exception):
    """Training stopped on SIGTERM after saving a backup; `epoch` is the (0-based) epoch to redo."""

    def __init__(self, epoch: int):
        super().__init__(f"stopped by SIGTERM during epoch {epoch + 1}")
        self.epoch = epoch


class Diverged(UserError):
    """The loss became NaN or Inf."""


class StopOnSignal(keras.callbacks.Callback):
    """On SIGTERM (preemption), saves a backup at the next batch end and stops with `Preempted`.

    The backup records the current epoch as not done, so a resumed run redoes
    it from the saved weights and history.csv never holds a partial epoch.
    """

    def __init__(self, backup: RunBackup):
        super().__init__()
        self.backup, self.requested, self.epoch, self.previous = backup, False, 0, None

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum, frame):
        self.requested = True
        log.warning("SIGTERM received: saving a backup at the end of this step")

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.requested:
            self.backup.save(self.epoch, batch + 1)  # this epoch is not finished: redo it on resume
            raise Preempted(self.epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.requested:  # arrived during validation: the epoch is complete and backed up already
            raise Preempted(epoch + 1)

    def on_train_end(self, logs=None):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


class StopOnNaN(keras.callbacks.Callback):
    """Stops at the first non-finite loss, before any checkpoint or backup takes the diverged weights."""

    def __init__(self, checkpoints: Path):
        super().__init__()
        self.checkpoints, self.epoch = checkpoints, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise Diverged(
                f"loss became {float(loss)} at epoch {self.epoch + 1}, step {batch + 1}; the last good checkpoints "
                f"stay in {self.checkpoints} (try a lower optimizer.lr or optimizer.clipnorm=1.0)"
            )


class HistoryLog(keras.callbacks.Callback):
    """Adds one row per epoch to history.csv, epochs numbered from 1 as in the log and metrics.json.

    The file is rewritten atomically (it is small), so it never holds half a row, even on a full disk.
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        rows = read_history_rows(self.path)
        row = {"epoch": epoch + 1, **{name: float(value) for name, value in sorted((logs or {}).items())}}
        header = list(rows[0]) if rows else []
        header += [name for name in row if name not in header]

        def write(temporary: Path) -> None:
            with open(temporary, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=header, restval="")
                writer.writeheader()
                writer.writerows([*rows, row])

        write_atomic(self.path, write)


def read_history_rows(path: Path) -> list[dict[str, str]]:
    """The rows of history.csv, [] before the first epoch ends."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


class LearningRateLog(keras.callbacks.Callback):
    """Adds the optimizer's current learning rate to the epoch logs (history.csv, TensorBoard)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class Curves(keras.callbacks.Callback):
    """Redraws curves.png from history.csv after epochs, in a background thread, and once more when training
    ends with every epoch.

    A drawing holds Python's lock for about a second (matplotlib's layout and PNG writer), time the training
    loop waits for. So the thread draws again only when at least `DRAW_SHARE` of the time since the last
    drawing ended would have gone into drawing: every epoch of a run whose epochs take a minute, every third
    or so of the digits demo's 6-second epochs.
    """

    DRAW_SHARE = 20  # the wall time between drawings, in drawing times: at most ~5% of the training time

    def __init__(self, history_csv: Path, path: Path, title: str = "", monitor: str = "val_accuracy", mode="max"):
        super().__init__()
        self.history_csv, self.path = history_csv, path
        self.title, self.monitor, self.mode = title, monitor, mode
        self.drawing: threading.Thread | None = None
        self.drawn_epochs = 0  # rows handed to the last drawing
        self.next_drawing = 0.0  # time.monotonic() from which the next drawing may start

    def on_epoch_end(self, epoch, logs=None):
        from trainer.visualize import read_history

        if (self.drawing is not None and self.drawing.is_alive()) or time.monotonic() < self.next_drawing:
            return  # the next epoch end (or the train end) catches up
        rows = read_history(self.history_csv)  # here, not in the thread: the next epoch rewrites the file
        self.drawn_epochs = len(rows)
        self.drawing = threading.Thread(target=self._draw_in_turn, args=(rows,), name="curves")  # joined at exit
        self.drawing.start()

    def _draw_in_turn(self, rows: list[dict]) -> None:
        started = time.monotonic()
        self._draw(rows)
        ended = time.monotonic()
        self.next_drawing = ended + self.DRAW_SHARE * (ended - started)

    def on_train_end(self, logs=None):
        from trainer.visualize import read_history

        if self.drawing is not None:
            self.drawing.join()
        rows = read_history(self.history_csv)
        if len(rows) != self.drawn_epochs:  # epochs ended while an earlier drawing was running
            self._draw(rows)

    def _draw(self, rows: list[dict]) -> None:
        from trainer.visualize import draw_curves

        try:
            draw_curves(rows, self.path, self.title, self.monitor, self.mode)
        except Exception as error:  # a plot must never stop training
            log.warning("could not draw %s: %s", self.path, error)


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


def rewrite_backup(backup: keras.callbacks.BackupAndRestore, model: keras.Model, epochs_done: int) -> None:
    """Backs up `model` as it stands, recorded as `epochs_done` epochs done (its `fit` restores from it).

    At a fine-tuning phase switch the old backup holds the previous phase's optimizer, whose
    variables the new one cannot take ("Skipping variable loading for optimizer").
    """
    backup.set_model(model)
    backup._current_epoch, backup._last_batch_seen = epochs_done, 0
    backup._save_model()


def best_so_far(history_csv: Path, monitor: str, mode: str) -> float | None:
    """The best `monitor` value in an existing history.csv (a resumed run), else None."""
    if not history_csv.is_file():
        return None
    with open(history_csv, newline="") as handle:
        values = [float(row[monitor]) for row in csv.DictReader(handle) if row.get(monitor)]
    return (max if mode == "max" else min)(values) if values else None


def training_callbacks(
    run_dir: Path,
    info: checkpoints.ModelInfo,
    monitor: str,
    mode: str,
    backup_dir: Path,
    save_every_steps: int | None = None,
    samples=None,
    tensorboard: bool = True,
    extra: list[keras.callbacks.Callback] | None = None,
    progress: bool = False,
    title: str = "",
) -> list[keras.callbacks.Callback]:
    """The callbacks every run gets, writing into `run_dir`; checkpoints carry `info`.

    `samples` is a few uint8 input images for TensorBoard. `extra` (early stopping,
    LR on plateau, experiment trackers) run after the epoch's files are written,
    with the learning rate in the logs, before the backup commits the epoch.
    `progress` adds a progress bar within each epoch (for a terminal); `title` heads curves.png.

    Order matters: the NaN check runs before anything saves; the learning rate
    joins the logs before history.csv and TensorBoard write them; the backup
    commits the epoch only after its history row and checkpoints are on disk
    (a kill in between redoes the epoch, never skips it); the SIGTERM stop
    comes last, after the epoch's files and backup are written.
    """
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    backup = RunBackup(backup_dir, save_every_steps)
    callbacks = [
        StopOnNaN(folder),
        LearningRateLog(),
        Checkpoints(folder, info, monitor, mode, best=best_so_far(run_dir / "history.csv", monitor, mode)),
        HistoryLog(run_dir / "history.csv"),
        Curves(run_dir / "history.csv", run_dir / "curves.png", title, monitor, mode),
        EpochLog(),
    ]
    if progress:
        callbacks.append(ProgressBar())
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(str(run_dir / "tensorboard"), write_graph=False))
    if tensorboard and samples is not None:
        callbacks.append(SampleImages(run_dir / "tensorboard", samples))
    callbacks.extend(extra or [])
    callbacks += [backup, StopOnSignal(backup)]
    return callbacks
