"""TFRecords read one record at a time for `mode=predict`: each record's stored name, label and image, or
why it cannot be used, so that a bad record gets its row and every other record is still predicted.

Training stops at a bad record (its data is wrong); predict reports it and goes on, as it does for an
unreadable image file. The checks name what the training pipeline would refuse: a record that is not an
Example, a missing or out-of-range label, an image feature that is missing, empty, repeated or of the
wrong length, a JPEG that does not decode (by the pipeline's own decoder), and a corrupted frame, after
which nothing more of that file can be read.

    python run.py mode=predict checkpoint=RUN predict.input='records/test.tfrecords*'
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import tensorflow as tf
from google.protobuf.message import DecodeError

from trainer.data.tfrecords import RecordSpec, compression_of, first_line


@dataclass
class CheckedRecord:
    """One record of a file: its position, stored file name, label, and why it cannot be used (if so)."""

    number: int  # within its file
    name: str = ""  # the stored file name, "" when there is none
    label: int | None = None
    error: str | None = None
    serialized: bytes | None = None  # the record, when it passed the checks
    image: object = None  # its decoded pixels, where a reader decoded it (`trainer.data.predict_inputs`)


def _stored_name(feature) -> str:
    """The filename feature as text, whatever its type (bytes as written; numbers as digits)."""
    kind = feature.WhichOneof("kind") if feature is not None else None
    values = list(getattr(feature, kind).value) if kind else []
    if kind == "bytes_list":
        values = [value.decode("utf-8", errors="backslashreplace") for value in values]
    return " ".join(str(value) for value in values)


def _label(features, key: str, num_classes: int) -> tuple[int | None, str | None]:
    values = features[key].int64_list.value if key in features else []
    if key not in features or len(values) != 1:
        return None, f"'{key}' must hold one int64 label"
    label = int(values[0])
    if not 0 <= label < num_classes:
        return None, f"has label {label}, expected 0 to {num_classes - 1} (the model's classes)"
    return label, None


def _image_error(features, spec: RecordSpec) -> str | None:
    values = features[spec.image_key].bytes_list.value if spec.image_key in features else []
    if len(values) != 1 or not values[0]:
        return f"cannot be decoded: '{spec.image_key}' must hold one non-empty byte string"
    if spec.format == "raw" and len(values[0]) != spec.raw_bytes:
        size = spec.stored_size
        return f"cannot be decoded: '{spec.image_key}' is not {size}x{size}x3 bytes (dataset.stored_size)"
    return None


def check_record(serialized: bytes, number: int, spec: RecordSpec, num_classes: int | None) -> CheckedRecord:
    """One serialized record checked on its own; `num_classes` None reads it as unlabeled."""
    try:
        features = tf.train.Example.FromString(serialized).features.feature
    except DecodeError:
        return CheckedRecord(number, error="is not a tf.train.Example")
    name = _stored_name(features[spec.filename_key]) if spec.filename_key in features else ""
    label, error = _label(features, spec.label_key, num_classes) if num_classes is not None else (None, None)
    error = error or _image_error(features, spec)
    return CheckedRecord(number, name, label, error, None if error else serialized)


def read_checked(path: str, spec: RecordSpec, num_classes: int | None, chunk: int) -> Iterator[list[CheckedRecord]]:
    """The records of one file in order, `chunk` at a time, each checked; a corrupted or truncated frame
    ends the file with one record that says so (TFRecord frames cannot be re-synchronized after it)."""
    records = tf.data.TFRecordDataset(path, compression_type=compression_of([path], spec.compression))
    batches, number = iter(records.batch(chunk)), 0
    while True:
        try:
            batch = next(batches, None)
        except tf.errors.OpError:
            yield _until_broken(records, number, spec, num_classes)
            return
        if batch is None:
            return
        yield [check_record(record, number + offset, spec, num_classes) for offset, record in enumerate(batch.numpy())]
        number += len(batch)


def _until_broken(records: tf.data.Dataset, start: int, spec: RecordSpec, num_classes: int | None) -> list:
    """The records from `start` that still read, one by one, then one for the broken frame."""
    checked, number = [], start
    try:
        for record in records.skip(start):
            checked.append(check_record(record.numpy(), number, spec, num_classes))
            number += 1
    except tf.errors.OpError as error:
        reason = f"is corrupted or truncated: the rest of the file cannot be read ({first_line(error)})"
        checked.append(CheckedRecord(number, error=reason))
    return checked


def stored_names(files: list[str], spec: RecordSpec) -> list[str]:
    """The file name stored in each record of `files` ("" where none), in order; names that are not valid
    UTF-8 keep their bytes as backslash escapes, numbers become their digits."""
    return [record.name for path in files for chunk in read_checked(path, spec, None, 1024) for record in chunk]
