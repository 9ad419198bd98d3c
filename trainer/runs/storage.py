"""The run's copies outside its folder: Vertex AI's output folders, written through `tf.io.gfile`.

    AIP_MODEL_DIR=gs://b/job/model AIP_CHECKPOINT_DIR=gs://b/job/checkpoints \\
    AIP_TENSORBOARD_LOG_DIR=gs://b/job/logs python run.py logger=tensorboard

Vertex AI sets these three for a `CustomJob` with a `baseOutputDirectory`. The run folder stays where it is
(its crash-safe writes rename files and lock, which Cloud Storage cannot); the chief also writes:
- TensorBoard's event files into `AIP_TENSORBOARD_LOG_DIR` (unless `logger.tensorboard.log_dir` is given);
- a copy of `checkpoints/` and of the committed `backup/` into `AIP_CHECKPOINT_DIR` at every epoch end
  (`Mirror`), from which a resumed run whose folder lost its backup takes it back (`restore_mirror`);
- the checked SavedModel into `AIP_MODEL_DIR` at the end of training (`saved_model.pb` at its top, as
  Vertex AI's prediction containers read it), and for `mode=export` without `export.dir`.

Any gfile URL works (`gs://`, `file://`, a local path); a folder that cannot be written is one line at start-up.
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import keras

from trainer.errors import DataError, DiskError
from trainer.runs.atomic import TEMPORARY_MARK

log = logging.getLogger(__name__)

VARIABLES = {"model": "AIP_MODEL_DIR", "checkpoints": "AIP_CHECKPOINT_DIR", "tensorboard": "AIP_TENSORBOARD_LOG_DIR"}
MIRRORED = ("checkpoints", "backup")  # the run folder's sub-folders copied into AIP_CHECKPOINT_DIR
LAST = ("training_metadata.json.bkp", "training_metadata.json")  # copied after the files they name: the commit


@dataclass(frozen=True)
class OutputFolders:
    """Where the chief writes copies of the run's outputs (None: nowhere but the run folder)."""

    model: str | None = None
    checkpoints: str | None = None
    tensorboard: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> OutputFolders:
        return cls(**{field: environ.get(name) or None for field, name in VARIABLES.items()})

    def within(self, *names: str) -> OutputFolders:
        """The same folders' sub-folder `names` (a sweep's job: its jobs share the variables)."""
        return OutputFolders(**{field: join(value, *names) if value else None for field, value in vars(self).items()})

    def given(self) -> dict[str, str]:
        """{environment variable: folder} of those set."""
        return {VARIABLES[field]: getattr(self, field) for field in VARIABLES if getattr(self, field)}


def join(base: str | os.PathLike, *names: str) -> str:
    """`base/names...` for a local path or a URL alike (`Path("gs://b/x") / "y"` would make `gs:/b/x/y`)."""
    base = os.fspath(base)
    return posixpath.join(base, *names) if "://" in base else os.path.join(base, *names)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _reason(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def check_writable(folder: str, name: str) -> None:
    """Makes `folder` and writes and deletes a probe file in it.

    Raises:
        DiskError: naming `name` (the variable or key) and the folder, with the file system's reason.
    """
    probe = join(folder, f".vggtrain-probe-{secrets.token_hex(4)}")
    try:
        _gfile().makedirs(folder)
        with _gfile().GFile(probe, "w") as file:
            file.write("vggtrain")
        _gfile().remove(probe)
    except Exception as error:  # tf.errors.OpError of any file system, or OSError
        raise DiskError(f"{name}={folder}: cannot be written ({_reason(error)})") from None


def check_no_saved_model(folder: str, name: str) -> None:
    """Refuses a model folder that holds a SavedModel already (nothing is overwritten): at start-up, not after
    the training whose model it would take.

    Raises:
        DataError: naming `name` (the variable) and the folder.
    """
    if _gfile().exists(join(folder, "saved_model.pb")):
        raise DataError(f"{name}={folder}: holds a SavedModel already; nothing is overwritten")


def copy_tree(source: Path, destination: str, key: str) -> None:
    """Copies the local folder `source` into `destination` (made if missing), replacing files of the same name.

    Raises:
        DiskError: naming `key` (the variable or config key) and `destination`.
    """
    gfile = _gfile()
    try:
        for folder, _, files in os.walk(source):
            relative = os.path.relpath(folder, source)
            target = destination if relative == "." else join(destination, *Path(relative).parts)
            gfile.makedirs(target)
            for name in files:
                gfile.copy(os.path.join(folder, name), join(target, name), overwrite=True)
    except Exception as error:  # tf.errors.OpError of any file system, or OSError
        raise DiskError(f"{key}={destination}: cannot be written ({_reason(error)})") from None


def sync_folder(source: Path, destination: str, copied: dict[str, tuple[int, int]]) -> None:
    """Makes `destination` hold what the local `source` holds: new and changed files (by size and time, as
    `copied` remembers them) are copied, the backup's metadata last, and files gone from `source` are deleted.
    """
    gfile = _gfile()
    found = source.iterdir() if source.is_dir() else ()
    local = {path.name: path for path in found if path.is_file() and TEMPORARY_MARK not in path.name}
    gfile.makedirs(destination)
    for name in sorted(local, key=lambda name: (name in LAST, LAST.index(name) if name in LAST else 0, name)):
        stat = local[name].stat()
        key = join(destination, name)
        if copied.get(key) != (stat.st_size, stat.st_mtime_ns):
            gfile.copy(str(local[name]), key, overwrite=True)
            copied[key] = (stat.st_size, stat.st_mtime_ns)
    for name in gfile.listdir(destination):
        if name not in local and not name.endswith("/"):
            gfile.remove(join(destination, name))
            copied.pop(join(destination, name), None)


def exists(path: str) -> bool:
    return _gfile().exists(path)


def remove_folder(folder: str) -> None:
    """Deletes `folder` (the mirrored backup, once the run's results are written); no error when it is gone."""
    if _gfile().exists(folder):
        _gfile().rmtree(folder)


def restore_mirror(mirror: str, backup_dir: Path) -> bool:
    """Copies the mirrored backup into the local `backup_dir` when that holds no committed backup and the mirror
    does: a resumed run whose folder lost its backup goes on from the copy. True when it did."""
    committed = join(mirror, LAST[-1])
    if (backup_dir / LAST[-1]).is_file() or not _gfile().exists(committed):
        return False
    backup_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(_gfile().listdir(mirror), key=lambda name: name in LAST):  # the metadata last
        if not name.endswith("/"):
            _gfile().copy(join(mirror, name), str(backup_dir / name), overwrite=True)
    log.info("%s held no backup: restored the copy in %s <AIP_CHECKPOINT_DIR>", backup_dir, mirror)
    return True


class Mirror(keras.callbacks.Callback):
    """Copies the run folder's `checkpoints/` and committed `backup/` into `destination` at every epoch end (put
    it after the callbacks that write them); the training task calls `sync` after a stop's or an early end's
    backup. A failed copy is one DiskError."""

    def __init__(self, run_dir: Path, destination: str):
        super().__init__()
        self.run_dir, self.destination, self.copied = Path(run_dir), destination, {}

    def sync(self) -> None:
        try:
            for name in MIRRORED:
                sync_folder(self.run_dir / name, join(self.destination, name), self.copied)
        except Exception as error:
            raise DiskError(f"AIP_CHECKPOINT_DIR={self.destination}: cannot be written ({_reason(error)})") from None

    def on_epoch_end(self, epoch, logs=None):
        self.sync()
