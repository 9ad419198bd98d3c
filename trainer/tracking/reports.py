"""What a finished evaluation leaves for people to read: the confusion matrix (CSV and PNG) and the run summary.

python run.py mode=evaluate checkpoint=RUN     # confusion_matrix_test.csv and .png
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from trainer.runs.atomic import write_atomic
from trainer.runs.spreadsheet import safe_row


def write_confusion_csv(path: str | os.PathLike, matrix, class_names: list[str]) -> Path:
    """The confusion matrix as CSV: one row per true class, one column per predicted class."""

    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(safe_row(["true \\ predicted", *class_names]))
            for name, row in zip(class_names, matrix, strict=True):
                writer.writerow(safe_row([name, *(int(count) for count in row)]))

    return write_atomic(path, write)


MAX_DRAWN_CLASSES = 30  # more classes: the most confused are drawn (0.6 inch each; 1000 were 60,000 pixels wide)


def most_confused(matrix, limit: int = MAX_DRAWN_CLASSES):
    """The indices (in class order) of the `limit` classes with the most mistakes, as true or as predicted class."""
    import numpy as np

    matrix = np.asarray(matrix)
    if len(matrix) <= limit:
        return np.arange(len(matrix))
    wrong = matrix.sum(axis=0) + matrix.sum(axis=1) - 2 * np.diag(matrix)
    return np.sort(np.argsort(-wrong, kind="stable")[:limit])


def plot_confusion_png(path: str | os.PathLike, matrix, class_names: list[str], title: str) -> Path:
    """The confusion matrix as a labelled heat map, counts in the cells. Above MAX_DRAWN_CLASSES classes, only the
    most confused are drawn (the title says so; the CSV beside it holds every class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = np.asarray(matrix)
    if len(class_names) > MAX_DRAWN_CLASSES:
        chosen = most_confused(matrix)
        title = f"{title}: the {len(chosen)} most confused of {len(class_names)} classes (all in the CSV)"
        matrix, class_names = matrix[np.ix_(chosen, chosen)], [class_names[index] for index in chosen]
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
    "report/report.html",
    "history.csv",
    "run.log",
    "checkpoints/best.keras",
)


def run_summary(run_dir: Path, metrics: dict[str, Any], tensorboard: str | None = None) -> str:
    """The end-of-run summary: the folder, the best epoch, val and test accuracy, and the files to open (and
    `tensorboard`, the folder TensorBoard wrote to, if any: a path or a gfile URL)."""
    files = [name for name in RUN_FILES if (run_dir / name).exists()]
    val = f"val_accuracy {metrics['val_accuracy']:.4f}, " if "val_accuracy" in metrics else ""  # trainer.validate
    lines = [
        f"Run finished: {run_dir.resolve()}",
        f"  best epoch {metrics['best_epoch']} of {metrics['epochs_completed']} by {metrics['objective_metric']}: "
        f"{val}test_accuracy {metrics['test_accuracy']:.4f} "
        f"(test_loss {metrics['test_loss']:.4f}), {metrics['train_seconds']:.0f} s of training",
        f"  open: {', '.join(files)}",
    ]
    if tensorboard:  # logger=tensorboard wrote there
        lines.append(f"  tensorboard --logdir {tensorboard if '://' in tensorboard else Path(tensorboard).resolve()}")
    return "\n".join(lines)
