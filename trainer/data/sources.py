"""Where a split's raw records come from: ranges of files (`trainer.data.shares.Records`), read by a format's reader.

    python run.py dataset=cifar                    # FixedLengthReader: byte ranges of the .bin files
    python run.py dataset=cats_dogs                # TFRecordReader: shards, read in parallel for training

A `Source` yields serialized records only; a batch decoder (`trainer.data.decoders`)
turns them into images and labels, and `trainer.data.pipeline` does the rest for
every format. Every path goes through `tf.data`, so `gs://`, `s3://` and `ram://` files
read like local ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import tensorflow as tf

from trainer.data.shares import Records

MAX_PARALLEL_READS = 8  # shards read at once in training


class Reader(Protocol):
    parallel: bool  # read several files at once in training (many shards), else one after another

    def read(self, path: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        """The serialized records [start, start + length) of one file (length -1: to its end)."""

    def read_files(self, paths: tf.data.Dataset, parallel_reads: int | None = None) -> tf.data.Dataset:
        """Every record of whole files, in the order `paths` yields them (`parallel_reads` at once, in a fixed
        interleaving)."""


@dataclass(frozen=True)
class FixedLengthReader:
    """Fixed-length binary records: a range is a byte range, so the records before it are never read."""

    record_bytes: int
    parallel: bool = False  # a few large local files

    def read(self, path, start, length):
        records = tf.data.FixedLengthRecordDataset(path, self.record_bytes, header_bytes=start * self.record_bytes)
        return records.take(length)

    def read_files(self, paths, parallel_reads=None):
        return tf.data.FixedLengthRecordDataset(paths, self.record_bytes, num_parallel_reads=parallel_reads)


@dataclass(frozen=True)
class TFRecordReader:
    """TFRecord files (`compression_type` "", "GZIP" or "ZLIB"); `skip` walks record headers only."""

    compression_type: str = ""
    parallel: bool = True

    def read(self, path, start, length):
        return tf.data.TFRecordDataset(path, compression_type=self.compression_type).skip(start).take(length)

    def read_files(self, paths, parallel_reads=None):
        return tf.data.TFRecordDataset(paths, compression_type=self.compression_type, num_parallel_reads=parallel_reads)


@dataclass(frozen=True)
class Source:
    """The records of one split, or of one worker's share of it, and how to read them."""

    records: Records
    reader: Reader

    @property
    def count(self) -> int:
        return self.records.count

    @property
    def _whole_files(self) -> bool:
        return all(start == 0 and length == -1 for _, start, length in self.records.ranges)

    def _ranges(self) -> tf.data.Dataset:
        paths, starts, lengths = zip(*self.records.ranges, strict=True)
        return tf.data.Dataset.from_tensor_slices(
            (list(paths), tf.constant(starts, tf.int64), tf.constant(lengths, tf.int64))
        )

    def _read(self, order: tf.data.Dataset, parallel_reads: int | None) -> tf.data.Dataset:
        """The records of `order`'s ranges: whole files through the reader's own file reader (TFRecordDataset's
        parallel reads are faster than an interleave of single files), ranges interleaved."""
        if self._whole_files:
            return self.reader.read_files(order.map(lambda path, start, length: path), parallel_reads)
        if parallel_reads is None:
            return order.flat_map(self.reader.read)
        return order.interleave(
            self.reader.read, cycle_length=parallel_reads, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )

    def in_order(self) -> tf.data.Dataset:
        """Every record once, files in the given order; the count is stated, so Keras can size an epoch."""
        records = self._read(self._ranges(), None)
        return records.apply(tf.data.experimental.assert_cardinality(self.count))

    def for_training(self, seed: int) -> tf.data.Dataset:
        """One pass's records in reading order: with a parallel reader, the files in an order seeded anew each
        pass and read several at once (deterministically); else in file order. The pipeline's shuffle
        buffer mixes them."""
        if not self.reader.parallel or len(self.records.ranges) < 2:
            return self._read(self._ranges(), None)
        order = self._ranges().shuffle(len(self.records.ranges), seed=seed, reshuffle_each_iteration=True)
        return self._read(order, min(len(self.records.ranges), MAX_PARALLEL_READS))
