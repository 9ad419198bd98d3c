"""MixUp and CutMix on whole host batches: images and one-hot labels mixed with the same weight.

    python run.py dataset.augment.mixup_alpha=0.2                            # MixUp
    python run.py dataset.augment.cutmix_alpha=1.0                           # CutMix
    python run.py dataset.augment.mixup_alpha=0.8 dataset.augment.cutmix_alpha=1.0 dataset.augment.mix_switch_prob=0.5

Each image of a training batch is mixed, with probability `mix_prob`, with its partner
in one random permutation of the batch: by MixUp (image and label weight lambda ~
Beta(alpha, alpha)) or by CutMix (the partner's pixels pasted into a box; the label
weight is the pasted share of the image). With both on, `mix_switch_prob` is the chance
of CutMix. The images and labels are transformed by Keras's own `MixUp` and `CutMix`
layers (`transform_images`, `transform_labels`); only the draw is ours:
- it is stateless, one seed per batch like the crops (`trainer.data.preprocess`), so a
  seeded run replays the same mixes under any parallelism and after a resume; Keras's
  layers draw from a seed-generator variable, which parallel `tf.data` maps update in
  any order;
- CutMix's box has whole-pixel sides and the label weight is its exact area; Keras 3.15
  weights the label by the area of a fractional box, up to a few percent away from the
  pixels it pastes (32x32 images), and draws alpha anew per batch from (0, alpha);
- an image not mixed keeps its own image and a one-hot label (weight 1).

Mixed images are float32 on the 0..255 scale (the training model takes float32 then); the
labels are float32 [batch, classes]. The loss and the metrics take these soft labels,
label smoothing applies on top of them ((1 - s) mixed + s / classes, as timm), and class
weights become each image's sample weight, its label's weighted mean (`with_class_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import tensorflow as tf

from trainer.data.augmentation import Augmentation
from trainer.data.preprocess import stream_seed, uniform

# Stateless streams of the batch seed (`stream_seed`), apart from the crops' (trainer.data.preprocess uses 0-4).
_PERMUTATION, _MIXED, _SWITCH, _MIXUP_A, _MIXUP_B, _CUT_A, _CUT_B, _BOX_Y, _BOX_X = range(10, 19)


@dataclass(frozen=True)
class Mixing:
    """What `dataset.augment` asks of MixUp and CutMix, for a dataset of `num_classes` classes."""

    num_classes: int
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5

    @classmethod
    def of(cls, augment: Augmentation, num_classes: int) -> Mixing | None:
        """The mixing `augment` asks for, or None when it mixes nothing."""
        if not augment.mixing:
            return None
        return cls(num_classes, augment.mixup_alpha, augment.cutmix_alpha, augment.mix_prob, augment.mix_switch_prob)


def _beta(batch: tf.Tensor, alpha: float, seed: tf.Tensor, streams: tuple[int, int]) -> tf.Tensor:
    """Beta(alpha, alpha) per image, as the ratio of two stateless gamma draws."""
    first = tf.random.stateless_gamma([batch], stream_seed(seed, streams[0]), alpha)
    second = tf.random.stateless_gamma([batch], stream_seed(seed, streams[1]), alpha)
    return first / tf.maximum(first + second, 1e-12)


def _boxes(shape: tf.Tensor, keep: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """CutMix boxes with whole-pixel sides: each image keeps about `keep` of its area. Returns the boolean
    masks [batch, height, width, channels] of the pasted pixels and the share of the image each keeps."""
    batch, height, width, channels = shape[0], shape[1], shape[2], shape[3]
    side = tf.sqrt(1.0 - keep)
    box_h = tf.cast(tf.round(side * tf.cast(height, tf.float32)), tf.int32)
    box_w = tf.cast(tf.round(side * tf.cast(width, tf.float32)), tf.int32)
    top = tf.cast(tf.floor(uniform(batch, seed, _BOX_Y) * tf.cast(height - box_h + 1, tf.float32)), tf.int32)
    left = tf.cast(tf.floor(uniform(batch, seed, _BOX_X) * tf.cast(width - box_w + 1, tf.float32)), tf.int32)
    rows = tf.range(height)[None, :, None, None]
    columns = tf.range(width)[None, None, :, None]
    inside_rows = (rows >= top[:, None, None, None]) & (rows < (top + box_h)[:, None, None, None])
    inside_columns = (columns >= left[:, None, None, None]) & (columns < (left + box_w)[:, None, None, None])
    masks = tf.tile(inside_rows & inside_columns, [1, 1, 1, channels])
    kept = 1.0 - tf.cast(box_h * box_w, tf.float32) / tf.cast(height * width, tf.float32)
    return masks, kept


def batch_mixer(mixing: Mixing) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """`mix(images, labels, seed)` for `tf.data` maps: Keras's layers are made here, outside any trace."""
    layers = keras.layers.MixUp(dtype="float32"), keras.layers.CutMix(dtype="float32")
    return lambda images, labels, seed: mix_batch(images, labels, seed, mixing, layers)


def mix_batch(
    images: tf.Tensor,
    labels: tf.Tensor,
    seed: tf.Tensor,
    mixing: Mixing,
    layers: tuple[keras.layers.MixUp, keras.layers.CutMix] | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """A training batch mixed by MixUp or CutMix.

    Args:
        images: uint8 (or float) [batch, height, width, channels].
        labels: int [batch] class indices.
        seed: The batch's int64 seed.
        mixing: What to mix.
        layers: Keras's MixUp and CutMix layers, whose transforms apply the draw (made anew if None: not
            inside a `tf.function`, where a layer's seed variable cannot be made).

    Returns:
        (float32 images on the 0..255 scale, float32 labels [batch, classes] that sum to 1).
    """
    shape = tf.shape(images)
    batch = shape[0]
    onehot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), mixing.num_classes, dtype=tf.float32)
    permutation = tf.argsort(uniform(batch, seed, _PERMUTATION))
    mixed = uniform(batch, seed, _MIXED) < mixing.prob
    if mixing.mixup_alpha and mixing.cutmix_alpha:
        cut = uniform(batch, seed, _SWITCH) < mixing.switch_prob
    else:
        cut = tf.fill([batch], bool(mixing.cutmix_alpha))
    mixup, cutmix = layers or (keras.layers.MixUp(dtype="float32"), keras.layers.CutMix(dtype="float32"))
    out = pixels = tf.cast(images, tf.float32)
    weight = tf.ones([batch])  # of each image's own label: 1 where an image is not mixed
    if mixing.mixup_alpha:
        weight = tf.where(mixed & ~cut, _beta(batch, mixing.mixup_alpha, seed, (_MIXUP_A, _MIXUP_B)), 1.0)
        out = mixup.transform_images(pixels, {"mix_weight": weight, "permutation_order": permutation})
    if mixing.cutmix_alpha:
        drawn = tf.where(mixed & cut, _beta(batch, mixing.cutmix_alpha, seed, (_CUT_A, _CUT_B)), 1.0)
        masks, kept = _boxes(shape, drawn, seed)
        pasted = cutmix.transform_images(
            pixels, {"batch_masks": masks, "mix_weight": kept, "permutation_order": permutation}
        )
        out = tf.where(cut[:, None, None, None], pasted, out)
        weight = tf.where(cut, kept, weight)
    soft = mixup.transform_labels(onehot, {"mix_weight": weight, "permutation_order": permutation})
    return out, soft


def with_class_weights(dataset: tf.data.Dataset, weights: dict[int, float]) -> tf.data.Dataset:
    """(images, soft labels) batches with a third element, each image's sample weight: its label's mean of
    the class weights (an image mixed 0.7 cat and 0.3 dog weighs 0.7 w_cat + 0.3 w_dog). Keras's own
    `class_weight` takes the argmax of a soft label."""
    vector = tf.constant([weights[index] for index in range(len(weights))], tf.float32)
    return dataset.map(
        lambda images, labels: (images, labels, tf.linalg.matvec(labels, vector)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
