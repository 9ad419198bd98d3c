"""Per-class figures of a split: precision, recall, F1, support and the classes each is confused with.

python run.py mode=evaluate checkpoint=RUN     # report/per_class.csv, and the table of report.html
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from trainer.runs.atomic import write_atomic
from trainer.runs.spreadsheet import safe_row

CONFUSED = 3  # the classes named as each class's most frequent mistakes
COLUMNS = ("class", "precision", "recall", "f1", "support", "confused_with")


def confusion(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """The confusion matrix, rows = true class."""
    return np.bincount(labels * num_classes + predicted, minlength=num_classes**2).reshape(num_classes, num_classes)


def class_rows(matrix: np.ndarray, class_names: list[str]) -> list[dict]:
    """One row per class: precision, recall, F1, support and up to `CONFUSED` (class, count) it is most often
    predicted as instead (most first)."""
    matrix = np.asarray(matrix, dtype=np.int64)
    right = np.diag(matrix).astype(np.float64)
    predicted, support = matrix.sum(axis=0), matrix.sum(axis=1)
    rows = []
    for index, name in enumerate(class_names):
        precision = right[index] / predicted[index] if predicted[index] else 0.0
        recall = right[index] / support[index] if support[index] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        wrong = [(int(count), other) for other, count in enumerate(matrix[index]) if other != index and count]
        wrong.sort(key=lambda pair: (-pair[0], pair[1]))
        confused = [(class_names[other], count) for count, other in wrong[:CONFUSED]]
        rows.append({"class": name, "precision": precision, "recall": recall, "f1": f1,
                     "support": int(support[index]), "confused_with": confused})  # fmt: skip
    return rows


def summary(matrix: np.ndarray) -> dict[str, float]:
    """Accuracy, balanced accuracy (the mean recall of the classes present) and macro F1."""
    matrix = np.asarray(matrix, dtype=np.float64)
    right, support, predicted = np.diag(matrix), matrix.sum(axis=1), matrix.sum(axis=0)
    present = support > 0
    recall = np.divide(right, support, out=np.zeros_like(right), where=present)
    precision = np.divide(right, predicted, out=np.zeros_like(right), where=predicted > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(right), where=total > 0)
    return {
        "accuracy": float(right.sum() / max(1.0, matrix.sum())),
        "balanced_accuracy": float(recall[present].mean()) if present.any() else 0.0,
        "macro_f1": float(f1.mean()),
    }


def confused_text(pairs: list[tuple[str, int]]) -> str:
    return "; ".join(f"{name} ({count})" for name, count in pairs)


def write_class_csv(path: str | os.PathLike, rows: list[dict]) -> Path:
    """per_class.csv: a row per class, `confused_with` as "name (count); ..."."""

    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            for row in rows:
                figures = [f"{row[key]:.6f}" for key in ("precision", "recall", "f1")]
                writer.writerow(safe_row([row["class"], *figures, row["support"], confused_text(row["confused_with"])]))

    return write_atomic(path, write)
