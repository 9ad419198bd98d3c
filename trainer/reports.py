"""Files a run leaves behind, each written atomically: a temporary file, then a rename.

A kill in the middle of a write leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainer.errors import DataError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path` (same suffix) and renames it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(handle)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


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


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Calls `write(temporary_path)`, then renames the result onto `path`."""
    with atomic_path(path) as temporary:
        write(temporary)
    return Path(path)


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
