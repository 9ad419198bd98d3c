"""Raw-pixel TFRecord files read through an index: each image is copied once, from the file into its batch.

`TFRecordDataset` + `parse_example` + `decode_raw` copies a 224x224 image four times
on its way into a batch and checks each record's CRC32C in software (TensorFlow 2.21's
wheel has the CPU's CRC instruction compiled out), which caps it near 1.5x the textbook
reader on two cores. Here, at start-up, `RecordIndex.build` walks each file's record
headers once (`example_wire`; the pixels are skipped, not read) and notes where every
record's pixels start and its label. Reading a batch is then, per record, one `preadv`
(a seek and `readv` on macOS) that puts the pixels straight into their slot of the
batch, and a CRC32C check of the whole record with the CPU instruction (the `crc32c`
package). Image and label still come from the same record: the label was read from
it and its checksum covers both.

Local files on a POSIX system only; `tfrecords` keeps TFRecordDataset for remote paths, JPEG
records and Windows.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import crc32c
import numpy as np
import tensorflow as tf

from trainer.data import example_wire
from trainer.errors import DataError

LABEL_MAX = 2**31 - 1  # labels are int32; larger stored labels read as this, and fail the range check
ALIGNMENT = 64  # TensorFlow's buffer alignment (EIGEN_MAX_ALIGN_BYTES); a NumPy array aligned to it is not copied


def _masked(crc: int) -> int:
    """TFRecord's masked CRC32C."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_at(descriptor: int, buffers: list, offset: int) -> int:
    """Fills `buffers` from the file at `offset`: `preadv` where the OS has it (Linux, BSD), else a seek and
    `readv` (macOS); safe either way, as each `read` call opens its own descriptors."""
    if hasattr(os, "preadv"):
        return os.preadv(descriptor, buffers, offset)
    os.lseek(descriptor, offset, os.SEEK_SET)
    return os.readv(descriptor, buffers)


def _aligned_empty(rows: int, row_bytes: int) -> np.ndarray:
    flat = np.empty(rows * row_bytes + ALIGNMENT, np.uint8)
    start = -flat.ctypes.data % ALIGNMENT
    return flat[start : start + rows * row_bytes].reshape(rows, row_bytes)


@dataclass(frozen=True, eq=False)
class RecordIndex:
    """Where each record of `files` sits: its file, its data span, where its pixels start, its label (-1: none)."""

    files: tuple[str, ...]
    first: np.ndarray  # index of each file's first record, plus the total at the end
    file: np.ndarray  # per record: its file
    start: np.ndarray  # per record: offset of its serialized Example
    end: np.ndarray  # per record: offset after it (its 4-byte checksum follows)
    pixels: np.ndarray  # per record: offset of its image bytes
    labels: np.ndarray  # per record: int32 label
    image_bytes: int

    @classmethod
    def build(cls, files: list[str], image_key: str, label_key: str, image_bytes: int, labeled: bool) -> RecordIndex:
        """Walks the record headers of every file.

        Raises:
            DataError: naming the file and record: truncated, a bad length checksum, not an Example,
                no `image_key` of `image_bytes` bytes, or (if `labeled`) no int64 `label_key`.
        """
        columns, first = [], [0]
        for path in files:
            rows = _index_file(path, image_key.encode(), label_key.encode(), image_bytes, labeled)
            columns.append(np.array(rows, np.int64).reshape(-1, 4))
            first.append(first[-1] + len(rows))
        table = np.concatenate(columns)
        file = np.repeat(np.arange(len(files)), np.diff(first))
        start, end, pixels, labels = map(np.ascontiguousarray, table.T)
        labels = np.clip(labels, -1, LABEL_MAX).astype(np.int32)  # out of range stays out of range, never wraps
        return cls(tuple(files), np.array(first), file, start, end, pixels, labels, image_bytes)

    def __len__(self) -> int:
        return int(self.first[-1])

    def read(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records `ids` as (uint8 images, one row of `image_bytes` each; int32 labels).

        Raises:
            ValueError: a record's checksum no longer matches, or its file got shorter or went away
                (it changed after start-up).
        """
        images = _aligned_empty(len(ids), self.image_bytes)
        descriptors = {}
        try:
            for slot, record in enumerate(ids):
                file = int(self.file[record])
                if file not in descriptors:
                    try:
                        descriptors[file] = os.open(self.files[file], os.O_RDONLY)
                    except OSError as error:
                        raise ValueError(f"{self.files[file]}: cannot be read any more ({error.strerror})") from None
                start, end, pixels = int(self.start[record]), int(self.end[record]), int(self.pixels[record])
                head, tail = bytearray(pixels - start), bytearray(end + 4 - pixels - self.image_bytes)
                if _read_at(descriptors[file], [head, images[slot], tail], start) != end + 4 - start:
                    raise ValueError(self._where(record) + " is cut short: the file changed after start-up")
                crc = crc32c.crc32c(memoryview(tail)[:-4], crc32c.crc32c(images[slot], crc32c.crc32c(head)))
                if _masked(crc) != struct.unpack_from("<I", tail, len(tail) - 4)[0]:
                    raise ValueError(self._where(record) + " fails its checksum: the file is corrupted")
        finally:
            for descriptor in descriptors.values():
                os.close(descriptor)
        return images, self.labels[ids]

    def _where(self, record: int) -> str:
        file = int(self.file[record])
        return f"{self.files[file]}: record {record - int(self.first[file])}"

    def batches(self, ids: tf.data.Dataset, height: int, width: int) -> tf.data.Dataset:
        """Batches of record ids to (uint8 height x width x 3 images, int32 labels), in the order of `ids`.

        One Python thread reads ~20k 224x224 images/s here; the file reads and the
        checksums run without the GIL, so tf.data's parallel calls overlap them.
        """

        def read(batch_ids):
            images, labels = tf.numpy_function(self.read, [batch_ids], (tf.uint8, tf.int32), stateful=False)
            images = tf.reshape(images, [-1, height, width, 3])
            images.set_shape(batch_ids.shape.concatenate([height, width, 3]))
            labels.set_shape(batch_ids.shape)
            return images, labels

        return ids.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def shuffled_ids(self, seed: int, shuffle_buffer: int) -> tf.data.Dataset:
        """Record ids, endlessly, in TFRecordDataset-reader order: files in a seeded order, up to 8 of them
        interleaved, then a shuffle buffer; every record once per epoch."""
        first = tf.constant(self.first, tf.int64)
        files = tf.data.Dataset.range(len(self.files)).shuffle(len(self.files), seed, reshuffle_each_iteration=True)
        ids = files.interleave(
            lambda file: tf.data.Dataset.range(first[file], first[file + 1]),
            cycle_length=min(len(self.files), 8),
        )
        return ids.shuffle(shuffle_buffer, seed, reshuffle_each_iteration=True).repeat()


def _index_file(
    path: str, image_key: bytes, label_key: bytes, image_bytes: int, labeled: bool
) -> list[tuple[int, int, int, int]]:
    """(start, end, pixels, label) of each record of one file."""
    rows, position, record = [], 0, 0
    descriptor = os.open(path, os.O_RDONLY)
    try:
        size, buffer = os.fstat(descriptor).st_size, example_wire.FileBytes(descriptor)
        while position < size:
            where = f"{path}: record {record}"
            header = os.pread(descriptor, 12, position)
            if len(header) < 12:
                raise DataError(f"{where} is cut short (a truncated TFRecord file)")
            length, length_crc = struct.unpack("<QI", header)
            if _masked(crc32c.crc32c(header[:8])) != length_crc:
                raise DataError(f"{where}: its length fails its checksum (a corrupted TFRecord file)")
            start, end = position + 12, position + 12 + length
            if end + 4 > size:
                raise DataError(f"{where} is cut short (a truncated TFRecord file)")
            try:
                features = example_wire.feature_spans(buffer, start, end)
            except ValueError as error:
                raise DataError(f"{where} is not a readable tf.train.Example: {error}") from None
            pixels = _value(features, image_key, example_wire.single_bytes, buffer, where)
            if pixels[1] - pixels[0] != image_bytes:
                raise DataError(
                    f"{where}: '{image_key.decode()}' holds {pixels[1] - pixels[0]} bytes, expected {image_bytes}"
                )
            label = _value(features, label_key, example_wire.single_int64, buffer, where) if labeled else -1
            rows.append((start, end, pixels[0], label))
            position, record = end + 4, record + 1
    finally:
        os.close(descriptor)
    return rows


def _value(features: dict, key: bytes, read, buffer, where: str):
    if key not in features:
        raise DataError(f"{where} has no '{key.decode()}' feature; keys: {sorted(k.decode() for k in features)}")
    try:
        return read(buffer, features[key])
    except ValueError as error:
        raise DataError(f"{where}: '{key.decode()}' {error}") from None
