"""Loss options: label smoothing and class weights (fixed, or balanced from the training split's counts).

    python run.py trainer.label_smoothing=0.1
    python run.py trainer.class_weight=balanced
    python run.py 'trainer.class_weight={0: 1.0, 1: 3.0}'

With class weights, Keras turns each example's weight into a sample weight,
so the training loss is mean(weight[label] x cross-entropy) over the batch;
the validation and test losses stay unweighted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import keras
from keras import ops

from trainer.errors import ConfigError

LOSS_NAME = "sparse_categorical_crossentropy"


def targets(y_true, y_pred):
    """Labels as probability targets like `y_pred`: integer labels ([batch] or [batch, 1]) one-hot, the soft
    labels of MixUp and CutMix ([batch, classes]) as they are."""
    if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] not in (1, None):
        return ops.cast(y_true, y_pred.dtype)
    labels = ops.cast(ops.reshape(y_true, (-1,)), "int32")
    return ops.one_hot(labels, ops.shape(y_pred)[-1], dtype=y_pred.dtype)


@keras.saving.register_keras_serializable(package="vggtrain")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy of integer labels (or of MixUp's and CutMix's soft labels) against (1 - s) targets +
    s / num_classes."""

    def __init__(self, label_smoothing: float = 0.0, name: str = LOSS_NAME, **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing}")
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        return keras.losses.categorical_crossentropy(
            targets(y_true, y_pred), y_pred, label_smoothing=self.label_smoothing
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def build_loss(label_smoothing: float = 0.0, soft_labels: bool = False) -> str | keras.losses.Loss:
    """Keras's sparse cross-entropy, or the form that smooths (`label_smoothing` > 0) or takes the soft labels
    of MixUp and CutMix (`soft_labels`) too."""
    return SmoothedSparseCrossentropy(label_smoothing) if label_smoothing or soft_labels else LOSS_NAME


def count_labels(dataset, num_classes: int) -> list[int]:
    """Examples per class in a dataset of (images, labels) batches, reading it once."""
    counts: Counter = Counter()
    for labels in dataset.map(lambda images, labels: labels):
        counts.update(labels.numpy().reshape(-1).tolist())
    return [counts.get(index, 0) for index in range(num_classes)]


def class_weights(option: str | Mapping[int, float] | None, counts: list[int] | None, num_classes: int):
    """The `class_weight` argument of `fit` for `trainer.class_weight`.

    Args:
        option: None, "balanced", or {class index: weight}.
        counts: Training examples per class (needed for "balanced").
        num_classes: Classes of the dataset; every one gets a weight (1.0 unless given).

    Returns:
        None, or {class index: weight} covering every class. Balanced weights are
        total / (num_classes x count), as scikit-learn's `compute_class_weight`.

    Raises:
        ConfigError: a class index outside the dataset, or a balanced weight for a split without counts.
    """
    if option is None:
        return None
    if option == "balanced":
        if counts is None or len(counts) != num_classes or not sum(counts):
            raise ConfigError(f"trainer.class_weight=balanced needs the training split's class counts; got {counts}")
        total = sum(counts)
        return {index: (total / (num_classes * count) if count else 1.0) for index, count in enumerate(counts)}
    outside = sorted(index for index in option if index >= num_classes)
    if outside:
        raise ConfigError(
            f"trainer.class_weight: class {outside[0]} is outside the dataset's {num_classes} classes "
            f"(0..{num_classes - 1})"
        )
    return {index: float(option.get(index, 1.0)) for index in range(num_classes)}
