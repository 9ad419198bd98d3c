"""The training state a resumed run restarts from: weights + optimizer, and how many epochs are done.

    python run.py resume=outputs/2026-11-30/12-00-00   # restores from RUN/backup/

Unlike Keras's `BackupAndRestore`, every save is crash-safe: the weights go to
a new file, then `training_metadata.json` is replaced atomically to point at it
(the commit), the previous metadata is kept as `training_metadata.json.bkp`,
and only then are older weight files deleted. A kill at any instant leaves a
metadata file whose weights are complete. The callback runs after history.csv
and the checkpoints are written, so an epoch counts as done only once its row
and its checkpoints are on disk. The backup is deleted by the training task
after metrics.json is written, never by the callback.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import math
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

from trainer.errors import ConfigError
from trainer.runs import checkpoints
from trainer.runs.atomic import remove_temporaries, write_atomic

log = logging.getLogger(__name__)

METADATA = "training_metadata.json"
PREVIOUS = METADATA + ".bkp"
ENDINGS = ("stopped_early", "pruned")  # why training ended before trainer.epochs (`mark_ended`)


@dataclass(frozen=True)
class BackupState:
    """A committed backup: `epoch` epochs are done; `weights` holds the weights (and the optimizer state, unless
    `state` holds it); `state`, the rest that Keras's files leave out (the random layers' seed states); `ended`
    says why training ended before `trainer.epochs` (`stopped_early`), or is empty while it goes on."""

    epoch: int
    batch: int
    weights: Path
    metadata: Path
    ended: str = ""
    state: Path | None = None

    def to_json(self, ended: str | None = None) -> str:
        data = {"epoch": self.epoch, "batch": self.batch, "weights": self.weights.name}
        if self.state is not None:
            data["state"] = self.state.name
        ended = self.ended if ended is None else ended
        return json.dumps({**data, "ended": ended} if ended else data)

    def files(self) -> set[str]:
        return {self.weights.name} | ({self.state.name} if self.state else set())


def _parse(metadata: Path) -> BackupState | None:
    """The state one metadata file describes, or None if it is unreadable, names an unknown ending or a
    missing file."""
    try:
        data = json.loads(metadata.read_text())
        epoch, batch = int(data["epoch"]), int(data.get("batch", 0))
        weights, ended = metadata.parent / data["weights"], str(data.get("ended", ""))
        extra = metadata.parent / data["state"] if data.get("state") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    state = BackupState(epoch, batch, weights, metadata, ended, extra)
    complete = all((metadata.parent / name).is_file() for name in state.files())
    return state if complete and ended in ("", *ENDINGS) else None


def read_state(backup_dir: Path) -> BackupState | None:
    """The newest readable backup in `backup_dir`: the metadata, else its `.bkp` copy; None if there is none.

    Raises:
        ConfigError: a metadata file exists but neither it nor its `.bkp` copy is usable.
    """
    files = [backup_dir / METADATA, backup_dir / PREVIOUS]
    if not any(path.is_file() for path in files):
        return None
    for path in files:
        state = _parse(path)
        if state is not None:
            if path.name == PREVIOUS:
                log.warning("%s is unreadable or incomplete: resuming from its previous copy %s", files[0], path)
            return state
    raise ConfigError(
        f"{files[0]}: the backup is unreadable (truncated JSON or missing weights) and so is its copy "
        f"{files[1].name}; delete {backup_dir} to train the run again from epoch 1"
    )


def mark_ended(backup_dir: Path, outcome: str) -> None:
    """Records in the committed backup that training has ended (`outcome`: `stopped_early`), so a resume of a run
    killed afterwards (in its test evaluation) runs only the evaluation instead of training on."""
    state = read_state(backup_dir)
    if state is None:
        return
    write_atomic(backup_dir / METADATA, lambda temporary: temporary.write_text(state.to_json(ended=outcome)))


def remove_backup(backup_dir: Path) -> None:
    """Deletes the backup: call only once the run's results (metrics.json) are on disk."""
    shutil.rmtree(backup_dir, ignore_errors=True)


def restore(model: keras.Model, backup_dir: Path, inference: keras.Model | None = None) -> BackupState | None:
    """Loads the newest backup into `model`: its weights, its optimizer state (if `model` is compiled) and its
    random layers' seed states. A backup that links an epoch's checkpoint (a `.keras` file of `inference`, the
    model whose layers `model` fits) loads it into `inference`.

    Raises:
        ConfigError: the backup cannot be read or does not fit the model.
    """
    state = read_state(backup_dir)
    if state is None:
        return None
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:  # its variables are in the backup too
        optimizer.build(model.trainable_variables)
    try:
        if state.weights.suffix == ".keras":
            (inference or model).load_weights(state.weights)
        else:
            model.load_weights(state.weights)
        if state.state is not None:
            _load_state(state.state, model)
    except Exception as error:  # a foreign or damaged file
        raise ConfigError(f"{state.weights}: cannot restore the backup ({str(error).splitlines()[0]})") from None
    return state


def seed_states(model: keras.Model) -> list:
    """The seed states of the model's random layers (dropout, flips, colour, the policies), which Keras's
    saving leaves out: restored, a resumed run draws the masks and flips the run would have drawn."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def _save_state(path: Path, model: keras.Model, optimizer: bool, means: bool = False) -> None:
    """The seed states, the optimizer's variables (iterations, slots, EMA, loss scale) where `optimizer`, and
    the metrics' running totals where `means` (a backup within an epoch), in order, as one `.npz` file."""
    groups = {
        "seed": seed_states(model),
        "optimizer": model.optimizer.variables if optimizer else [],
        "metrics": model.metrics_variables if means else [],
    }
    arrays = {
        f"{group}_{index}": keras.ops.convert_to_numpy(variable)
        for group, variables in groups.items()
        for index, variable in enumerate(variables)
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getbuffer())


def _stored(path: Path, group: str, variables: list) -> list[np.ndarray]:
    """The values of `group` in the `.npz` at `path`, checked against the `variables` they belong to."""
    with np.load(path) as stored:
        arrays = dict(stored.items())
    count = sum(name.startswith(f"{group}_") for name in arrays)
    values = [arrays[f"{group}_{index}"] for index in range(count)]
    if count and [value.shape for value in values] != [tuple(variable.shape) for variable in variables]:
        raise ValueError(f"{path.name}: {count} {group} variables that do not fit the model's {len(variables)}")
    return values


def _load_state(path: Path, model: keras.Model) -> None:
    for group, variables in (("seed", seed_states(model)), ("optimizer", model.optimizer.variables)):
        values = _stored(path, group, variables)
        if group == "seed" and len(values) != len(variables):
            raise ValueError(f"{path.name}: {len(values)} seed variables that do not fit the model's {len(variables)}")
        for variable, value in zip(variables, values, strict=False):  # no optimizer values: in the weights file
            variable.assign(value)


def restore_means(model: keras.Model, state: BackupState) -> bool:
    """Puts the metrics' running totals of a backup made within an epoch (`state.batch` steps into it) back into
    `model`'s metrics, so the epoch's means go on over its earlier steps; False when the backup holds none.
    Call after `fit` has reset the metrics at the epoch's start."""
    if state.state is None:
        return False
    values = _stored(state.state, "metrics", model.metrics_variables)
    for variable, value in zip(model.metrics_variables, values, strict=False):
        variable.assign(value)
    return bool(values)


class _InMemoryWeightsFile(io.BytesIO):
    """A `.weights.h5` file in memory: Keras checks the name, HDF5 writes into the buffer."""

    def __str__(self) -> str:
        return "backup.weights.h5"


def _available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this system: assume room
        return 1 << 62


def save_weights(model: keras.Model, path: Path) -> None:
    """`model.save_weights(path)` (weights and optimizer state), built in memory and then written as plain
    bytes: HDF5 crashes the process (SIGSEGV) when the disk fills under its own writes, where a plain write
    fails with one OSError. Keras's `.keras` saving goes through memory too. A state too large for half the
    free memory is written by HDF5 itself, once the disk is seen to hold it.

    Raises:
        OSError: the disk cannot hold the file.
    """
    variables = [*model.weights, *getattr(getattr(model, "optimizer", None), "variables", [])]
    size = sum(math.prod(variable.shape) * np.dtype(variable.dtype).itemsize for variable in variables)
    if size < _available_memory() // 2:
        buffer = _InMemoryWeightsFile()
        model.save_weights(buffer)
        path.write_bytes(buffer.getbuffer())
        return
    free = shutil.disk_usage(path.parent).free
    if free < size * 1.1 + (1 << 20):
        need = f"about {size / 1e6:.0f} MB needed, {free / 1e6:.0f} MB free"
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({need})")
    model.save_weights(path)


class RunBackup(keras.callbacks.Callback):
    """Restores the weights at train begin; commits a backup at every epoch end (and every
    `save_every_steps` steps). Put it after every callback that writes the epoch's files.

    At an epoch end the weights are not saved a second time: the backup links `checkpoint` (the last.keras that
    `Checkpoints` has just written of `inference`, whose layers the fitted model shares; a copy where the file
    system has no hard links) and adds the optimizer state in a `.state.npz` of its own (a checkpoint holds the
    model only: `trainer.runs.checkpoints.save`). Without `checkpoint` (the EMA: it holds the averages), or
    when it does not hold this epoch, the backup saves the fitted model's weights and optimizer state itself.
    Every backup keeps the random layers' seed states in the `.state.npz`, which Keras's files leave out, and
    one made within an epoch the metrics' running totals too: a resumed run puts them back when `fit` starts
    that epoch again, so its history row holds the means over all its steps. `synchronize(model)` runs after
    the restore (a multi-worker run: every worker takes the chief's state; the totals, each worker's own, are
    not kept there).
    """

    def __init__(
        self,
        backup_dir: Path,
        save_every_steps: int | None = None,
        checkpoint: Path | None = None,
        inference: keras.Model | None = None,
        synchronize: Callable[[keras.Model], None] | None = None,
    ):
        super().__init__()
        self.backup_dir, self.save_every_steps = Path(backup_dir), save_every_steps
        self.checkpoint, self.inference, self.synchronize = checkpoint, inference, synchronize
        self.epoch, self.steps_since_save = 0, 0
        self.restored: BackupState | None = None

    def on_train_begin(self, logs=None):
        if self.backup_dir.is_dir():
            remove_temporaries(self.backup_dir)
        self.restored = restore(self.model, self.backup_dir, self.inference)
        if self.synchronize is not None:
            self.synchronize(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        within, self.restored = self.restored, None
        if within is not None and within.batch and within.epoch == epoch and self.synchronize is None:
            restore_means(self.model, within)  # fit has just reset the metrics: the epoch's steps before the stop

    def on_train_batch_end(self, batch, logs=None):
        if not self.save_every_steps:
            return
        self.steps_since_save += 1
        if self.steps_since_save >= self.save_every_steps:
            self.save(self.epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        info = checkpoints.read_info(self.checkpoint) if self.checkpoint and self.checkpoint.is_file() else None
        if info is not None and info.epoch == epoch + 1:
            self._link_checkpoint(epoch + 1)
        else:
            self.save(epoch + 1)

    def save(self, epochs_done: int, batch: int = 0) -> None:
        """Commits the model's state as `epochs_done` finished epochs (+ `batch` steps of the next)."""
        self.steps_since_save = 0
        weights = self._new_file(epochs_done, batch, ".weights.h5")
        write_atomic(weights, lambda temporary: save_weights(self.model, temporary))
        state = self._rest(epochs_done, batch, optimizer=False)  # the optimizer state is in the weights file
        self._commit(BackupState(epochs_done, batch, weights, self.backup_dir / METADATA, state=state))

    def _link_checkpoint(self, epochs_done: int) -> None:
        self.steps_since_save = 0
        weights = self._new_file(epochs_done, 0, ".keras")
        try:
            os.link(self.checkpoint, weights)
        except OSError:  # no hard links here (or across these folders): a copy, which takes milliseconds
            write_atomic(weights, lambda temporary: shutil.copyfile(self.checkpoint, temporary))
        state = self._rest(epochs_done, 0, optimizer=True)  # a checkpoint holds the model only, never its optimizer
        self._commit(BackupState(epochs_done, 0, weights, self.backup_dir / METADATA, state=state))

    def _rest(self, epochs_done: int, batch: int, optimizer: bool) -> Path | None:
        """The `.npz` of what the weights file lacks: the seed states, the optimizer state where `optimizer`, and
        within an epoch (`batch` steps into it) the metrics' running totals; None when that is nothing."""
        means = bool(batch) and self.synchronize is None
        if not optimizer and not means and not seed_states(self.model):
            return None
        path = self._new_file(epochs_done, batch, ".state.npz")
        write_atomic(path, lambda temporary: _save_state(temporary, self.model, optimizer, means))
        return path

    def _new_file(self, epochs_done: int, batch: int, suffix: str) -> Path:
        self.backup_dir.mkdir(parents=True, exist_ok=True)
        return self.backup_dir / f"epoch{epochs_done:05d}-step{batch:06d}-{secrets.token_hex(3)}{suffix}"

    def _commit(self, state: BackupState) -> None:
        """Makes `state` the backup (its previous metadata kept as the `.bkp` copy), then deletes every file
        neither names."""
        current = self.backup_dir / METADATA
        if _parse(current) is not None:
            text = current.read_text()
            write_atomic(self.backup_dir / PREVIOUS, lambda temporary: temporary.write_text(text))
        write_atomic(current, lambda temporary: temporary.write_text(state.to_json()))  # the commit
        previous = _parse(self.backup_dir / PREVIOUS)
        kept = state.files() | (previous.files() if previous else set())
        for path in self.backup_dir.glob("epoch*"):
            if path.name not in kept:
                path.unlink(missing_ok=True)
