"""Batch decoders: a batch of raw records in, (uint8 images [n, h, w, c], int32 labels [n]) out.

    python run.py dataset=cifar          # BinaryDecoder: label byte, then channel-first planes
    python run.py dataset=cats_dogs      # TFRecordDecoder: `parse_example`, then raw pixels or JPEG

Image and label come out of one parse of one record, so they cannot drift apart.
Each decoder checks the labels it parses against the number of classes (an error the
pipeline turns into one line naming the file and record); unlabeled TFRecords get -1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from trainer.data.binary import BinaryLayout
from trainer.data.decode import decode_images
from trainer.data.tfrecords import RecordSpec

Decoder = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]  # a batch of records -> (uint8 images, int32 labels)
LABEL_MAX = 2**31 - 1  # labels are saturated to int32, so one past int32 still fails the range check


def check_labels(labels: tf.Tensor, num_classes: int | None) -> tf.Tensor:
    """`labels`, asserted to lie in [0, num_classes) (no check for None: unlabeled records)."""
    if num_classes is None:
        return labels
    tf.debugging.assert_less(labels, num_classes, message=f"a record has a label >= num_classes={num_classes}")
    tf.debugging.assert_non_negative(labels, message="a record has a negative label")
    return labels


@dataclass(frozen=True)
class BinaryDecoder:
    """Fixed-length records: `label_bytes` label bytes, then the pixels channel-first (R plane, G, B)."""

    layout: BinaryLayout
    num_classes: int | None = None

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        layout = self.layout
        raw = tf.reshape(tf.io.decode_raw(records, tf.uint8), [-1, layout.record_bytes])
        labels = tf.cast(raw[:, layout.label_index], tf.int32)
        planes = tf.reshape(raw[:, layout.label_bytes :], [-1, layout.channels, layout.height, layout.width])
        return tf.transpose(planes, [0, 2, 3, 1]), check_labels(labels, self.num_classes)

    def labels(self, records: tf.Tensor) -> tf.Tensor:
        """The labels of a batch of records alone (k-fold's stratification)."""
        raw = tf.reshape(tf.io.decode_raw(records, tf.uint8), [-1, self.layout.record_bytes])
        return check_labels(tf.cast(raw[:, self.layout.label_index], tf.int32), self.num_classes)


@dataclass(frozen=True)
class TFRecordDecoder:
    """`tf.train.Example` records of `spec`: parsed a batch at a time; raw pixels decoded as one tensor,
    encoded images (JPEG, PNG ...) one by one inside the batch, by the one decode (`trainer.data.decode`)."""

    spec: RecordSpec
    num_classes: int | None = None  # None: unlabeled records (label -1), as predict reads test sets
    labeled: bool = True
    resize_mode: str = "resize"  # how an encoded image is made square, as `serve_bytes` does (`dataset.resize_mode`)

    def _parse(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        spec = self.spec
        description = {spec.image_key: tf.io.FixedLenFeature([], tf.string)}
        if self.labeled:
            description[spec.label_key] = tf.io.FixedLenFeature([], tf.int64)
        parsed = tf.io.parse_example(records, description)
        encoded = parsed[spec.image_key]
        if not self.labeled:
            return encoded, -tf.ones(tf.shape(encoded), tf.int32)
        return encoded, self._label(parsed)

    def _label(self, parsed: dict[str, tf.Tensor]) -> tf.Tensor:
        # Saturated, not wrapped: a label past int32 must still fail the range check.
        return tf.cast(tf.clip_by_value(parsed[self.spec.label_key], -1, LABEL_MAX), tf.int32)

    def labels(self, records: tf.Tensor) -> tf.Tensor:
        """The labels of a batch of records alone, no image decoded (k-fold's stratification)."""
        parsed = tf.io.parse_example(records, {self.spec.label_key: tf.io.FixedLenFeature([], tf.int64)})
        return check_labels(self._label(parsed), self.num_classes)

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        spec = self.spec
        encoded, labels = self._parse(records)
        if spec.format == "raw":
            size = spec.stored_size
            message = f"'{spec.image_key}' is not {size}x{size}x3 bytes (dataset.stored_size)"
            tf.debugging.assert_equal(tf.strings.length(encoded), spec.raw_bytes, message=message)
            images = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [-1, spec.stored_size, spec.stored_size, 3])
        else:
            images = decode_images(encoded, spec.stored_size, self.resize_mode)  # the one decode (trainer.data.decode)
        return images, check_labels(labels, self.num_classes if self.labeled else None)
