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
READ_AHEAD = 2  # records each of them reads ahead


class Reader(Protocol):
    parallel: bool  # read several files at once in training (many shards), else one after another
    # Optional, for a format whose file is one record (an image folder): `record(path)` reads it. Its files are
    # then read by one parallel map, with no dataset (nor read-ahead thread) per file.

    def read(self, path: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        """The serialized records [start, start + length) of one file (length -1: to its end); `Source` numbers
        them, so each keeps its file and number (its provenance) through the pipeline."""


@dataclass(frozen=True)
class FixedLengthReader:
    """Fixed-length binary records: a range is a byte range, so the records before it are never read."""

    record_bytes: int
    parallel: bool = False  # a few large local files

    def read(self, path, start, length):
        records = tf.data.FixedLengthRecordDataset(path, self.record_bytes, header_bytes=start * self.record_bytes)
        return records.take(length)


def tfrecord_dataset(paths, compression_type: str = "", parallel_reads: int | None = None) -> tf.data.Dataset:
    """The records of TFRecord files (`compression_type` "", "GZIP" or "ZLIB"): the one place they are opened."""
    return tf.data.TFRecordDataset(paths, compression_type=compression_type, num_parallel_reads=parallel_reads)


@dataclass(frozen=True)
class TFRecordReader:
    """TFRecord files (`compression_type` "", "GZIP" or "ZLIB"); `skip` walks record headers only."""

    compression_type: str = ""
    parallel: bool = True

    def read(self, path, start, length):
        return tfrecord_dataset(path, self.compression_type).skip(start).take(length)


@dataclass(frozen=True)
class Source:
    """The records of one split, or of one worker's share of it, and how to read them."""

    records: Records
    reader: Reader

    @property
    def count(self) -> int:
        return self.records.count

    def _ranges(self) -> tf.data.Dataset:
        paths, starts, lengths = zip(*self.records.ranges, strict=True)
        return tf.data.Dataset.from_tensor_slices(
            (list(paths), tf.constant(starts, tf.int64), tf.constant(lengths, tf.int64))
        )

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def _numbered(self, path: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        """One range's records, each with its provenance: (its file, its number in that file, the record); a reader
        that picks records out of a file (Parquet's held-out rows) numbers them itself (`numbered`)."""
        numbered = getattr(self.reader, "numbered", None)
        if numbered:
            with_file = tf.autograph.experimental.do_not_convert(lambda number, record: (path, number, record))
            return numbered(path, start, length).map(with_file)
        # Zipped, not mapped: no function runs per record (issue 53's tfrecord_reader benchmark).
        numbers = tf.data.Dataset.range(start, tf.int64.max)
        path_each = tf.data.Dataset.from_tensors(path).repeat()
        return tf.data.Dataset.zip((path_each, numbers, self.reader.read(path, start, length)))

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def _read_ahead(self, path: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tf.data.Dataset:
        """`_numbered`, read ahead by a thread of its own: the files of an interleave are read at once."""
        return self._numbered(path, start, length).prefetch(READ_AHEAD)

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def _whole(self, path: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> tuple:
        return path, start, self.reader.record(path)

    def _read(self, order: tf.data.Dataset, parallel_reads: int | None) -> tf.data.Dataset:
        """The numbered records of `order`'s ranges: one after another, or `parallel_reads` files interleaved in a
        fixed order, each read ahead by a thread of its own. Not `interleave(num_parallel_calls=...)`: its worker
        pool added about a quarter to the CPU time of reading a large record (page faults of its threads'
        allocations), which TFRecordDataset's own parallel reads do not pay (issue 53's tfrecord_reader benchmark).
        A file that is one record is read by a parallel map, in order: a dataset and a thread per file cost a
        folder of photos a tenth of its first epoch (the folder_pipeline benchmark)."""
        if self._one_record_each():
            return order.map(self._whole, num_parallel_calls=parallel_reads or MAX_PARALLEL_READS, deterministic=True)
        if parallel_reads is None:
            return order.flat_map(self._numbered)
        return order.interleave(self._read_ahead, cycle_length=parallel_reads)

    def _one_record_each(self) -> bool:
        """Whether every range is a whole file that the reader reads as one record (`Reader.record`)."""
        whole = all(start == 0 and length in (-1, 1) for _, start, length in self.records.ranges)
        return whole and hasattr(self.reader, "record")

    def in_order(self) -> tf.data.Dataset:
        """Every record once, as (file, number in it, record), files in the given order; the count is stated, so
        Keras can size an epoch."""
        records = self._read(self._ranges(), None)
        return records.apply(tf.data.experimental.assert_cardinality(self.count))

    def for_training(self, seed: int) -> tf.data.Dataset:
        """One pass's (file, number, record)s in reading order: with a parallel reader, the files in an order
        seeded anew each pass and read several at once (deterministically); else in file order. The pipeline's
        shuffle buffer mixes them."""
        if not self.reader.parallel or len(self.records.ranges) < 2:
            return self._read(self._ranges(), None)
        order = self._ranges().shuffle(len(self.records.ranges), seed=seed, reshuffle_each_iteration=True)
        return self._read(order, min(len(self.records.ranges), MAX_PARALLEL_READS))
