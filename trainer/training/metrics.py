"""Evaluate a classifier in one pass: loss, accuracy, top-k and the confusion matrix, under any strategy.

The confusion matrix is a Keras metric, so `model.evaluate` fills it in the
same pass as the loss, replicas add their counts, and image and label never
leave the batch they came in. Dropout is off: `evaluate` calls the model
with `training=False`.

The loss reported is the data loss, the cross-entropy of the labels: Keras's own `loss` adds the
weights' L2 penalty, which made a 98.6% accurate model report a loss of 0.97. The penalty is
reported beside it as `regularization_loss`.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from trainer.evaluation import classes
from trainer.training.losses import targets


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


def top_k(num_classes: int, k: int = 5) -> int:
    """The k reported as top-k accuracy: `k`, or fewer for small label sets (none for 2 classes, or k=0)."""
    return min(k, num_classes - 1) if num_classes > 2 and k > 0 else 0


CROSS_ENTROPY = "cross_entropy"  # the data loss, a compiled metric: Keras's `loss` includes the L2 penalty
PENALTY = "regularization_loss"  # the L2 penalty of the weights, reported beside the data loss


@keras.saving.register_keras_serializable(package="vggtrain")
def label_cross_entropy(y_true, y_pred):
    """The cross-entropy of integer or soft (MixUp, CutMix) labels."""
    return keras.losses.categorical_crossentropy(targets(y_true, y_pred), y_pred)


@keras.saving.register_keras_serializable(package="vggtrain")
def label_accuracy(y_true, y_pred):
    """Whether the predicted class is the label's (a soft label's largest share)."""
    target = ops.argmax(targets(y_true, y_pred), axis=-1)
    return ops.cast(ops.equal(target, ops.argmax(y_pred, axis=-1)), "float32")


def cross_entropy(soft_labels: bool = False) -> keras.metrics.Metric:
    """The cross-entropy of the labels, unweighted and unsmoothed: the data loss that runs report. With
    `soft_labels`, of integer and soft labels alike (training on MixUp's, validating on integers)."""
    if soft_labels:
        return keras.metrics.MeanMetricWrapper(label_cross_entropy, name=CROSS_ENTROPY)
    return keras.metrics.SparseCategoricalCrossentropy(name=CROSS_ENTROPY)


def training_metrics(soft_labels: bool = False) -> list:
    """What `compile` reports: accuracy and the data loss. With soft labels, training accuracy is that of
    each mixed label's largest share."""
    if soft_labels:
        return [keras.metrics.MeanMetricWrapper(label_accuracy, name="accuracy"), cross_entropy(True)]
    return ["accuracy", cross_entropy()]


def honest_loss(logs: dict, penalty: float | None = None) -> dict:
    """Keras logs with `loss` (and `val_loss`) replaced by the data loss, the cross-entropy metric, and the
    L2 penalty beside it as `regularization_loss`: `penalty`, or by default what Keras's `loss` adds to the
    cross-entropy (exact in an evaluation, where the weights do not change)."""
    if penalty is None and CROSS_ENTROPY in logs:
        penalty = float(logs["loss"]) - float(logs[CROSS_ENTROPY])
    for prefix in ("", "val_"):
        if f"{prefix}{CROSS_ENTROPY}" in logs:
            logs[f"{prefix}loss"] = float(logs.pop(f"{prefix}{CROSS_ENTROPY}"))
    if penalty is not None:
        logs[PENALTY] = penalty
    return logs


def compile_for_evaluation(model: keras.Model, num_classes: int, k: int = 5) -> None:
    """Recompiles a (loaded) model with the evaluation metrics (top-`k` accuracy, see `top_k`); call inside
    the strategy scope."""
    metrics = ["accuracy", cross_entropy()]
    k = top_k(num_classes, k)
    if k:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(k, name=f"top{k}_accuracy"))
    metrics.append(ConfusionMatrix(num_classes))
    model.compile(loss="sparse_categorical_crossentropy", metrics=metrics)


def evaluate(
    model: keras.Model, dataset, class_names: list[str], callbacks: list | None = None, verbose: int = 0
) -> tuple[dict, np.ndarray]:
    """Evaluates a model compiled by `compile_for_evaluation` on a dataset of (image, label) batches, with
    `callbacks` (the multi-worker step watchdog).

    Returns:
        (metrics, confusion matrix): metrics holds loss (the cross-entropy), regularization_loss (the L2
        penalty Keras adds to it), accuracy, top-k accuracy
        (more than 2 classes), balanced accuracy, macro F1 and `per_class` precision/recall/F1/support.
    """
    logs = honest_loss(model.evaluate(dataset, verbose=verbose, return_dict=True, callbacks=callbacks))
    matrix = np.asarray(logs.pop("confusion_matrix"), dtype=np.int64)
    metrics = {name: float(value) for name, value in logs.items()}
    figures = classes.summary(matrix)
    metrics["balanced_accuracy"], metrics["macro_f1"] = figures["balanced_accuracy"], figures["macro_f1"]
    metrics["num_examples"] = int(matrix.sum())
    metrics["per_class"] = {
        row["class"]: {key: row[key] for key in ("precision", "recall", "f1", "support")}
        for row in classes.class_rows(matrix, class_names)
    }
    return metrics, matrix
