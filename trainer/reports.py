"""Files a run leaves behind, each written atomically: a temporary file, then a rename.

A kill in the middle of a write leaves the previous file intact (and a `.NAME.tmp-*` file that
the next process holding the run folder's lock removes); a full disk is one `DiskError` line.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import os
import re
import secrets
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainer.errors import DataError, DiskError

TEMPORARY_MARK = ".tmp-"  # in the name of every temporary file: `.NAME.tmp-XXXXXXXX.SUFFIXES`


def _create_temporary(path: Path) -> Path:
    """Creates an empty file beside `path`, keeping its suffixes (`.weights.h5`, `.keras`): Keras and
    matplotlib pick the format from them. Created with mode 0666 less the umask (mkstemp's 0600 would
    hide metrics and checkpoints from teammates)."""
    suffixes = "".join(path.suffixes)
    while True:
        temporary = path.parent / f".{path.name}{TEMPORARY_MARK}{secrets.token_hex(4)}{suffixes}"
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return temporary
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path` (same suffixes) and renames it onto `path` on success.

    Raises:
        DiskError: the temporary file cannot be created (full disk, read-only or unwritable folder).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = _create_temporary(path)
    except OSError as error:
        raise DiskError(f"cannot write {path}: {_reason(error)}") from None
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _reason(error: BaseException) -> str:
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    text = " ".join(text.split()) or type(error).__name__  # one line: HDF5's messages span several
    match = re.search(r"error message = '([^']+)'", text)  # HDF5: "... errno = 28, error message = 'No space ..."
    if match:
        return match.group(1)
    return text if len(text) < 200 else text[:200] + "..."


def remove_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files a killed process left in `folder` (call only while holding its lock)."""
    leftovers = [path for path in Path(folder).glob(f".*{TEMPORARY_MARK}*") if path.is_file()]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


def check_writable(path: str | os.PathLike, key: str) -> None:
    """Fails early, naming the config key, when a file cannot be created beside `path`.

    Raises:
        DataError: the folder cannot be created or written.
    """
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise DataError(f"{key}={path}: cannot write there ({error.strerror or error})") from None


PREDICTION_HEADER = "id,file,predicted_index,predicted_class,"  # how every prediction CSV begins


def check_prediction_output(path: str | os.PathLike, key: str = "predict.output") -> None:
    """Fails before any prediction unless `path` is a new `.csv` file or an earlier prediction CSV:
    a checkpoint, a folder or any other file is never replaced.

    Raises:
        DataError: `path` is not a `.csv` name, is a folder, is some other file, or cannot be written.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{key}={path} is a folder; give a .csv file path (e.g. {path / 'predictions.csv'})")
    if path.suffix.lower() != ".csv":
        raise DataError(f"{key}={path}: predictions are written as CSV; give a path ending in .csv")
    if path.exists():
        try:
            with open(path, newline="") as handle:
                first = handle.readline(4096)
        except (OSError, UnicodeDecodeError):
            first = ""
        if not first.startswith(PREDICTION_HEADER):
            raise DataError(
                f"{key}={path} exists and is not a prediction CSV (its first line is not {PREDICTION_HEADER}...); "
                "it is left untouched: choose another path or remove it"
            )
    check_writable(path, key)


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Calls `write(temporary_path)`, then renames the result onto `path`; nothing is left half-written.

    Raises:
        DiskError: writing failed with an OS error (full disk, quota, permissions); `path` is unchanged.
    """
    with atomic_path(path) as temporary:
        try:
            write(temporary)
        except OSError as error:
            _release_hdf5(temporary)
            raise DiskError(f"cannot write {path}: {_reason(error)}; the previous file is unchanged") from None
    return Path(path)


def _release_hdf5(temporary: Path) -> None:
    """Closes the HDF5 handles a failed `save_weights` left open on `temporary`. Left to the garbage
    collector, h5py flushes them again at interpreter exit, prints a traceback and, on a full disk,
    crashes the process (SIGSEGV) after the one-line error."""
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return
    previous, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None  # the flush fails again: expected
    try:
        for handle in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
            if Path(os.fsdecode(handle.name)).name == temporary.name:
                with contextlib.suppress(Exception):
                    handle.close()
        gc.collect()
    finally:
        sys.unraisablehook = previous


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Writes `data` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return write_atomic(path, lambda temporary: temporary.write_text(text))


def write_confusion_csv(path: str | os.PathLike, matrix, class_names: list[str]) -> Path:
    """The confusion matrix as CSV: one row per true class, one column per predicted class."""

    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["true \\ predicted", *class_names])
            for name, row in zip(class_names, matrix, strict=True):
                writer.writerow([name, *(int(count) for count in row)])

    return write_atomic(path, write)


def plot_confusion_png(path: str | os.PathLike, matrix, class_names: list[str], title: str) -> Path:
    """The confusion matrix as a labelled heat map, counts in the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = np.asarray(matrix)
    size = max(4.0, 0.6 * len(class_names) + 2.0)
    figure, axes = plt.subplots(figsize=(size, size), dpi=100)
    shown = axes.imshow(matrix, cmap="Blues")
    ticks = range(len(class_names))
    axes.set_xticks(ticks, class_names, rotation=45, ha="right")
    axes.set_yticks(ticks, class_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(title)
    if len(class_names) <= 30:
        threshold = matrix.max() / 2 if matrix.size else 0
        for (row, column), count in np.ndenumerate(matrix):
            axes.text(
                column,
                row,
                int(count),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if count > threshold else "black",
            )
    figure.colorbar(shown, ax=axes, fraction=0.046, pad=0.04)
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
    plt.close(figure)
    return Path(path)


RUN_FILES = (
    "curves.png",
    "confusion_matrix_test.png",
    "metrics.json",
    "history.csv",
    "run.log",
    "checkpoints/best.keras",
)


def run_summary(run_dir: Path, metrics: dict[str, Any]) -> str:
    """The end-of-run summary: the folder, the best epoch, val and test accuracy, and the files to open."""
    files = [name for name in RUN_FILES if (run_dir / name).exists()]
    return "\n".join(
        [
            f"Run finished: {run_dir.resolve()}",
            f"  best epoch {metrics['best_epoch']} of {metrics['epochs_completed']} by {metrics['objective_metric']}: "
            f"val_accuracy {metrics['val_accuracy']:.4f}, test_accuracy {metrics['test_accuracy']:.4f} "
            f"(test_loss {metrics['test_loss']:.4f}), {metrics['train_seconds']:.0f} s of training",
            f"  open: {', '.join(files)}",
            f"  tensorboard --logdir {(run_dir / 'tensorboard').resolve()}",
        ]
    )
