"""A model's probabilities on a split, in one pass, keeping the images of the few examples a report shows.

python run.py mode=evaluate checkpoint=RUN     # report/: the worst mistakes, the borderline correct
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class Predictions:
    """Every example's probabilities and label, in the split's order; the images of the kept examples."""

    probabilities: np.ndarray  # float32 [examples, classes]
    labels: np.ndarray  # int64 [examples]
    mistakes: list[tuple[int, np.ndarray]]  # (index, image): the most confident wrong predictions, worst first
    borderline: list[tuple[int, np.ndarray]]  # (index, image): the least confident right ones, least first

    @property
    def predicted(self) -> np.ndarray:
        return self.probabilities.argmax(axis=1)


class _Kept:
    """The `count` examples of largest score seen so far, with their images (bounded memory)."""

    def __init__(self, count: int) -> None:
        self.count, self.rows = count, []

    def offer(self, scores: np.ndarray, indices: np.ndarray, images: np.ndarray) -> None:
        best = np.argsort(-scores, kind="stable")[: self.count]
        self.rows += [(float(scores[i]), int(indices[i]), images[i].copy()) for i in best]
        self.rows = sorted(self.rows, key=lambda row: (-row[0], row[1]))[: self.count]

    def kept(self) -> list[tuple[int, np.ndarray]]:
        return [(index, image) for _, index, image in self.rows]


def forward(model: keras.Model):
    """`model(images, training=False)` as one graph for batches of any size (traced once)."""
    spec = tf.TensorSpec([None, *model.input_shape[1:]], model.inputs[0].dtype)
    return tf.function(lambda images: model(images, training=False), input_signature=[spec])


def predict_split(model: keras.Model, dataset: tf.data.Dataset, keep: int, step=None) -> Predictions:
    """Runs `model` (dropout off; or `step`, its `forward`) over (image, label) batches. Keeps the images of
    the `keep` most confident wrong predictions and of the `keep` least confident right ones."""
    step = step or forward(model)
    probabilities, labels = [], []
    mistakes, borderline = _Kept(keep), _Kept(keep)
    seen = 0
    for images, batch_labels in dataset:
        batch = np.asarray(step(images), dtype=np.float32)
        truth = np.asarray(batch_labels).reshape(-1).astype(np.int64)
        pixels = np.asarray(images)
        indices = np.arange(seen, seen + len(truth))
        wrong = batch.argmax(axis=1) != truth
        confidence = batch.max(axis=1)
        mistakes.offer(confidence[wrong], indices[wrong], pixels[wrong])
        borderline.offer(-confidence[~wrong], indices[~wrong], pixels[~wrong])
        probabilities.append(batch)
        labels.append(truth)
        seen += len(truth)
    if not probabilities:
        raise ValueError("the split holds no examples")
    return Predictions(np.concatenate(probabilities), np.concatenate(labels), mistakes.kept(), borderline.kept())
