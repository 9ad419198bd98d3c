"""Keras callbacks for a training run: checkpoints, history.csv, the epoch log, the NaN and SIGTERM stops.

python run.py   # writes checkpoints/, history.csv and tensorboard/ in the run folder
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import keras

from trainer.distribute.agreement import Workers
from trainer.errors import ConfigError, UserError
from trainer.runs import checkpoints, history
from trainer.runs.atomic import write_atomic
from trainer.runs.backup import RunBackup
from trainer.runs.storage import Mirror
from trainer.tracking.curves import Curves
from trainer.training.metrics import CROSS_ENTROPY, honest_loss

log = logging.getLogger(__name__)


@contextlib.contextmanager
def averaged_weights(model: keras.Model, ema: bool = True) -> Iterator[None]:
    """With `ema`, the optimizer's moving average of the weights is in `model`'s variables for the body, the
    trained weights again after it (swapped in place by Keras's `SwapEMAWeights`, under any strategy)."""
    if not ema:
        yield
        return
    swap = keras.callbacks.SwapEMAWeights()
    swap.set_model(model)
    swap.on_test_begin()  # swaps the averages in
    try:
        yield
    finally:
        swap.on_test_end()  # and back


class Checkpoints(keras.callbacks.Callback):
    """Saves `inference` (the model being fitted, or the inference model that shares its layers) with its
    `ModelInfo` and epoch to `last.keras` at every epoch end and copies it to a pending best when `monitor`
    improves, which `CommitBest` makes `best.keras` once the backup has committed the epoch; all atomic.
    Copying the file takes milliseconds, a second save ~0.2 s. With `ema`, the checkpoints hold the
    optimizer's moving average of the weights (the backup keeps both)."""

    def __init__(
        self,
        folder: Path,
        inference: keras.Model,
        info: checkpoints.ModelInfo,
        monitor: str,
        mode: str = "max",
        best: float | None = None,
        ema: bool = False,
        tolerance: float = 0.0,
    ):
        super().__init__()
        self.inference, self.info, self.ema = inference, info, ema
        self.last, self.best_path = folder / "last.keras", folder / "best.keras"
        self.monitor, self.mode, self.tolerance = monitor, mode, tolerance
        self.peak = best if best is not None else (-math.inf if mode == "max" else math.inf)  # the best value seen

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not all(math.isfinite(float(value)) for value in logs.values()):
            return  # never replace a good checkpoint with diverged weights
        value = logs.get(self.monitor)
        if value is None:
            raise ValueError(f"objective.metric={self.monitor!r} is not among the metrics {sorted(logs)}")
        info = dataclasses.replace(self.info, epoch=epoch + 1)
        with averaged_weights(self.model, self.ema):
            write_atomic(self.last, lambda temporary: checkpoints.save(self.inference, temporary, info))
        if history.improves(value, self.peak, self.mode, self.tolerance):
            better = history.improves(value, self.peak, self.mode)
            how = "improved to" if better else f"within objective.tolerance={self.tolerance:g} of {self.peak:.4f}:"
            log.info("Epoch %d: %s %s %.4f, saving %s", epoch + 1, self.monitor, how, value, self.best_path)
            self.peak = value if better else self.peak
            pending = checkpoints.pending_best(self.best_path.parent, epoch + 1)  # best.keras once committed
            write_atomic(pending, lambda temporary: shutil.copyfile(self.last, temporary))


class CommitBest(keras.callbacks.Callback):
    """After the backup has committed the epoch, its new best (if any) becomes best.keras."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def on_epoch_end(self, epoch, logs=None):
        checkpoints.commit_best(self.folder, epoch + 1)


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


class AfterFirstStep(keras.callbacks.Callback):
    """Calls `work` once, after the first training step of `fit` (the start-up checks that the step need not wait
    for): it must come after EpochLog, whose line marks the step, and before anything that saves within an
    epoch (RunBackup), so that what `work` raises stops the run before anything of it is saved."""

    def __init__(self, work: Callable[[], None]):
        super().__init__()
        self.work = work

    def on_train_batch_end(self, batch, logs=None):
        if self.work is not None:
            work, self.work = self.work, None
            work()


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


TIME_BUDGET = 0  # `Preempted.signum` when trainer.time_budget, not a signal, stopped training
# What stopped a run, as invocations.jsonl records it. SIGUSR1: Slurm's warning before --time ends.
STOPPED_BY = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1", TIME_BUDGET: "time budget"}


class Preempted(Exception):
    """Training stopped on SIGTERM, SIGINT (Ctrl-C), SIGUSR1 or its time budget after saving a backup; `epoch` is
    the (0-based) epoch a resume goes on in, `steps` the steps of it the backup holds (0 at an epoch's end),
    `signum` the signal (`TIME_BUDGET` for the budget)."""

    def __init__(self, epoch: int, signum: int = signal.SIGTERM, steps: int = 0):
        super().__init__(f"stopped by {STOPPED_BY[signum]} during epoch {epoch + 1}")
        self.epoch, self.signum, self.steps = epoch, signum, steps


class TimeBudget:
    """When a run given `seconds` from `started` (a `time.monotonic()` value) must stop: before an epoch that would
    not fit (its longest epoch so far, plus a margin for the save: 10% of that epoch, at least 5 s), or within
    an epoch longer than foreseen once only the margin is left.

    Raises (`check_step`):
        ConfigError: the budget is shorter than one epoch, as measured from this run's steps.
    """

    def __init__(self, seconds: float, started: float, steps_per_epoch: int, clock=time.monotonic):
        self.seconds, self.deadline, self.steps, self.clock = seconds, started + seconds, steps_per_epoch, clock
        self.longest_epoch, self.steps_seen, self.steps_started = 0.0, 0, 0.0

    def margin(self) -> float:
        return max(5.0, 0.1 * self.longest_epoch)

    def check_step(self) -> None:
        """Call at each step end: after the first steps (the first is the trace), refuses a budget under one
        epoch, measured."""
        self.steps_seen += 1
        if self.steps_seen == 2:
            self.steps_started = self.clock()
        elif self.steps_seen == 5 and not self.longest_epoch:
            epoch = (self.clock() - self.steps_started) / 3 * self.steps
            if epoch + self.margin() > self.seconds:
                raise ConfigError(
                    f"trainer.time_budget={self.seconds:g} s is shorter than one epoch (about {epoch:.0f} s, measured "
                    f"from this run's steps, plus {self.margin():.0f} s to save); raise it or lower "
                    f"trainer.steps_per_epoch"
                )

    def epoch_done(self, seconds: float) -> None:
        self.longest_epoch = max(self.longest_epoch, seconds)

    def out_of_time_in_epoch(self) -> bool:
        return self.deadline - self.clock() < self.margin()

    def next_epoch_fits(self) -> bool:
        return self.deadline - self.clock() >= self.longest_epoch + self.margin()


class Diverged(UserError):
    """The loss became NaN or Inf."""


class StopOnSignal(keras.callbacks.Callback):
    """On SIGTERM (preemption), SIGUSR1 (Slurm's warning) or SIGINT (Ctrl-C), saves a backup at the next batch end
    and stops with `Preempted`; a second Ctrl-C stops at once (the backup of the last epoch stays). A `budget`
    stops it the same way, at an epoch end before an epoch that would not fit (or within a longer one).

    The backup records the current epoch as not done and the steps of it trained, so a resumed run goes on
    from the next step (`trainer.training.resumed`) and history.csv never holds a partial epoch.

    `any_stop(requested)` says whether some worker of a multi-worker run was asked to stop: then every
    worker stops at the same step (a worker not signalled stops as for SIGTERM).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(
        self, backup: RunBackup, any_stop: Callable[[bool], bool] | None = None, budget: TimeBudget | None = None
    ):
        super().__init__()
        self.backup, self.requested, self.epoch, self.previous = backup, None, 0, {}
        self.any_stop, self.budget, self.epoch_started = any_stop or bool, budget, 0.0

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._request) for signum in self.SIGNALS}

    def _request(self, signum, frame):
        if self.requested == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C
        self.requested = signum
        log.warning("%s received: saving a backup at the end of this step", STOPPED_BY[signum])

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.epoch_started = epoch, time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.budget is not None and self.requested is None:
            self.budget.check_step()
            if self.budget.out_of_time_in_epoch():
                self.requested = TIME_BUDGET
        if self.any_stop(self.requested is not None):
            self.backup.save(self.epoch, batch + 1)  # this epoch is not finished: a resume goes on from the next step
            raise Preempted(self.epoch, self.requested if self.requested is not None else signal.SIGTERM, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        last = epoch + 1 >= self.params.get("epochs", 0)
        if self.budget is not None and self.requested is None:
            self.budget.epoch_done(time.monotonic() - self.epoch_started)
            if not last and not self.budget.next_epoch_fits():
                self.requested = TIME_BUDGET
        if self.any_stop(self.requested is not None):  # during validation: the epoch is backed up already
            raise Preempted(epoch + 1, self.requested if self.requested is not None else signal.SIGTERM)

    def on_train_end(self, logs=None):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous = {}


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
    """Adds one row per epoch to history.csv, epochs numbered from 1 as in the log and metrics.json."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch + 1, **{name: float(value) for name, value in sorted((logs or {}).items())}}
        history.append_row(self.path, row)


class DataLoss(keras.callbacks.Callback):
    """Makes the epoch's `loss` and `val_loss` the data loss (the cross-entropy metric `compile` adds), and
    logs the L2 penalty of the epoch's final weights as `regularization_loss`, for every later callback:
    history.csv, the trackers, early stopping. Keras's own loss adds the penalty to the cross-entropy."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and CROSS_ENTROPY in logs:
            penalty = sum(float(keras.ops.convert_to_numpy(loss)) for loss in self.model.losses)
            honest_loss(logs, penalty)


class LearningRateLog(keras.callbacks.Callback):
    """Adds the optimizer's current learning rate to the epoch logs (history.csv, TensorBoard)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


@dataclass(frozen=True)
class RunFiles:
    """What the run's own callbacks write: checkpoints of `inference` carrying `info`, history.csv, curves.png,
    the backup (of the model being fitted)."""

    run_dir: Path
    backup_dir: Path
    inference: keras.Model  # what the checkpoints hold: the fitted model, or the inference view of its layers
    info: checkpoints.ModelInfo
    monitor: str  # objective.metric: best.keras and the best epoch of curves.png follow it
    mode: str  # max | min
    save_every_steps: int | None = None  # also back up every N steps
    tolerance: float = 0.0  # objective.tolerance: a later epoch within it of the best takes its place
    title: str = ""  # heads curves.png
    ema: bool = False  # the optimizer keeps an EMA of the weights: validation and checkpoints use it
    workers: Workers | None = None  # a multi-worker run: the state restored and the stops are the chief's / all's
    budget: TimeBudget | None = None  # trainer.time_budget: stop before an epoch that would not fit
    mirror: str | None = None  # AIP_CHECKPOINT_DIR: checkpoints/ and backup/ copied there (`storage.Mirror`)


def training_callbacks(
    files: RunFiles,
    loggers: list[keras.callbacks.Callback] = (),
    extra: list[keras.callbacks.Callback] = (),
    progress: bool = False,
) -> list[keras.callbacks.Callback]:
    """The callbacks every run gets, writing into `files.run_dir`.

    `loggers` (TensorBoard, its run label and sample images) write the epoch's logs once the learning
    rate is in them; `extra` (early stopping, LR on plateau, experiment trackers) run after the epoch's
    files are written, before the backup commits the epoch. `progress` adds a progress bar within each
    epoch (for a terminal).

    Order matters: the NaN check runs before anything saves; the data loss
    replaces Keras's loss (which adds the L2 penalty) and the learning rate
    joins the logs before history.csv, TensorBoard and early stopping read them; the backup
    commits the epoch only after its history row and checkpoints are on disk
    (a kill in between redoes the epoch, never skips it), and only then does a
    new best become best.keras (it never holds an uncommitted epoch); the SIGTERM stop
    comes last, after the epoch's files and backup are written.
    """
    run_dir, folder = files.run_dir, files.run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    last = None if files.ema else folder / "last.keras"  # with the EMA, last.keras holds the averages
    synchronize = files.workers.take_chief_state if files.workers else None
    backup = RunBackup(files.backup_dir, files.save_every_steps, last, files.inference, synchronize)
    history_csv = run_dir / history.FILE
    best = history.best_value(history_csv, files.monitor, files.mode)
    callbacks = [
        *([keras.callbacks.SwapEMAWeights()] if files.ema else []),  # validation on the averaged weights
        StopOnNaN(folder),
        DataLoss(),
        LearningRateLog(),
        Checkpoints(folder, files.inference, files.info, files.monitor, files.mode, best, files.ema, files.tolerance),
        HistoryLog(history_csv),
        Curves(history_csv, run_dir / "curves.png", files.title, files.monitor, files.mode, files.tolerance),
        EpochLog(),
        *([ProgressBar()] if progress else []),
        *loggers,
        *extra,
        backup,
        CommitBest(folder),
        StopOnSignal(backup, files.workers.any_stop if files.workers else None, files.budget),
        *([Mirror(run_dir, files.mirror)] if files.mirror else []),  # what the epoch end committed
    ]
    return callbacks
