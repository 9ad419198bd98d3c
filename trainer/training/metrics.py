"""Evaluate a classifier in one pass: loss, accuracy, top-k and the confusion matrix, under any strategy.

The confusion matrix is a Keras metric, so `model.evaluate` fills it in the
same pass as the loss, replicas add their counts, and image and label never
leave the batch they came in. Dropout is off: `evaluate` calls the model
with `training=False`.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


class ConfusionMatrix(keras.metrics.Metric):
    """Counts (true class, predicted class) pairs; `result()` is the matrix, rows = true class."""

    def __init__(self, num_classes: int, name: str = "confusion_matrix", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.matrix = self.add_variable((num_classes, num_classes), "zeros", dtype="int64", name="matrix")

    def update_state(self, y_true, y_pred, sample_weight=None):
        true = ops.cast(ops.reshape(y_true, [-1]), "int64")
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int64")
        pairs = ops.one_hot(true * self.num_classes + predicted, self.num_classes**2, dtype="int64")
        self.matrix.assign_add(ops.reshape(ops.sum(pairs, axis=0), (self.num_classes, self.num_classes)))

    def result(self):
        return ops.convert_to_tensor(self.matrix)

    def reset_state(self):
        self.matrix.assign(ops.zeros((self.num_classes, self.num_classes), dtype="int64"))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes}


def top_k(num_classes: int) -> int:
    """The k reported as top-k accuracy: 5, or fewer for small label sets (none for 2 classes)."""
    return min(5, num_classes - 1) if num_classes > 2 else 0


def compile_for_evaluation(model: keras.Model, num_classes: int) -> None:
    """Recompiles a (loaded) model with the evaluation metrics; call inside the strategy scope."""
    metrics = ["accuracy"]
    k = top_k(num_classes)
    if k:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(k, name=f"top{k}_accuracy"))
    metrics.append(ConfusionMatrix(num_classes))
    model.compile(loss="sparse_categorical_crossentropy", metrics=metrics)


def per_class(matrix: np.ndarray, class_names: list[str]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support of each class, from a confusion matrix (rows = true class)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    true_positive = np.diag(matrix)
    predicted = matrix.sum(axis=0)
    support = matrix.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_positive / predicted, 0.0)
        recall = np.where(support > 0, true_positive / support, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return {
        name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
        for name, p, r, f, s in zip(class_names, precision, recall, f1, support, strict=True)
    }


def evaluate(model: keras.Model, dataset, class_names: list[str], verbose: int = 0) -> tuple[dict, np.ndarray]:
    """Evaluates a model compiled by `compile_for_evaluation` on a dataset of (image, label) batches.

    Returns:
        (metrics, confusion matrix): metrics holds loss, accuracy, top-k accuracy
        (more than 2 classes), macro F1 and `per_class` precision/recall/F1/support.
    """
    logs = model.evaluate(dataset, verbose=verbose, return_dict=True)
    matrix = np.asarray(logs.pop("confusion_matrix"), dtype=np.int64)
    classes = per_class(matrix, class_names)
    metrics = {name: float(value) for name, value in logs.items()}
    metrics["macro_f1"] = float(np.mean([values["f1"] for values in classes.values()]))
    metrics["num_examples"] = int(matrix.sum())
    metrics["per_class"] = classes
    return metrics, matrix
