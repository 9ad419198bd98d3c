"""TFRecord image files: the feature spec shared by the writer (`trainer.data.folder_to_records`) and the reader,
and the checks of the files themselves (globs, compression, first record, every record's checksum and label).

Two layouts:
- `raw`, the classic Cats-vs-Dogs recipe: `label` (int64) and `img_raw` (the
  height x width x 3 uint8 pixels), nothing else, so files written here and
  files users already have are interchangeable.
- `jpeg`, the TF Model Garden / TFDS keys: `image/encoded`, `image/class/label`,
  `image/filename`, `image/height`, `image/width`, `image/format`.

Everything goes through `tf.io.gfile` and `tf.data`, so every file system TensorFlow
knows works (local disk, `gs://`, `s3://`, `hdfs://`, `ram://`). Reading records for
training is `trainer.data.sources.TFRecordReader`; decoding them,
`trainer.data.decoders.TFRecordDecoder`.

    python run.py dataset=cats_dogs dataset.data_dir=records/
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from dataclasses import dataclass

import tensorflow as tf
from google.protobuf.message import DecodeError

from trainer.data import record_writer
from trainer.data.record_writer import DEFAULT_KEYS, FORMATS
from trainer.errors import TF_FUNCTION_NODE, DataError

log = logging.getLogger(__name__)

COMPRESSIONS = ("auto", "none", "gzip", "zlib")
TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}  # our names -> TFRecordDataset's compression_type
SCAN_BATCH = 1024  # records parsed at once when counting and checking a file


@dataclass(frozen=True)
class RecordSpec:
    """How images are stored in the records."""

    format: str = "raw"  # raw | jpeg
    stored_size: int = 224  # raw: side of the stored square image
    image_key: str = "img_raw"
    label_key: str = "label"
    filename_key: str = "filename"
    compression: str = "auto"  # auto | none | gzip | zlib

    @classmethod
    def for_format(
        cls, format: str, stored_size: int = 224, compression: str = "auto", **keys: str | None
    ) -> RecordSpec:
        """The spec with the default keys of `format`, overridden by any non-empty `keys`."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}. Received: format={format}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}. Received: compression={compression}")
        chosen = {**DEFAULT_KEYS[format], **{name: key for name, key in keys.items() if key}}
        return cls(format, stored_size, chosen["image"], chosen["label"], chosen["filename"], compression)

    @property
    def raw_bytes(self) -> int:
        return self.stored_size * self.stored_size * 3


def make_example(
    spec: RecordSpec, image: bytes, label: int | None, filename: str | bytes | None, height: int, width: int
) -> bytes:
    """One serialized `tf.train.Example`, the same bytes on every run (deterministic map order).

    `image` is the raw pixels (raw) or the encoded JPEG (jpeg). A labeled raw
    example holds exactly `label` and `img_raw`, as the classic recipe does.
    A `bytes` filename is stored as it is (names that are not valid UTF-8).
    """
    keys = {"image": spec.image_key, "label": spec.label_key, "filename": spec.filename_key}
    name = filename.encode() if isinstance(filename, str) else filename
    features = record_writer.example_features(spec.format, keys, image, label, name, height, width)
    return record_writer.encode_example(features)


def _local(path: str) -> bool:
    return "://" not in path


def expand(patterns: list[str] | str, key: str) -> list[str]:
    """The files matched by a glob or list of globs on any TensorFlow file system, sorted per pattern.

    A file matched by several globs is read once (and the log says so).

    Raises:
        DataError: a pattern matches no file, or matches a folder.
    """
    files, seen, repeated = [], set(), []
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        pattern = os.path.expanduser(pattern) if _local(pattern) else pattern
        try:
            matched = sorted(tf.io.gfile.glob(pattern))
        except tf.errors.OpError as error:
            raise DataError(f"{key}: cannot list {pattern} ({first_line(error)})") from None
        if not matched:
            raise DataError(f"{key}: {pattern} matches no file")
        for path in matched:
            if tf.io.gfile.isdir(path):
                raise DataError(f"{key}: {pattern} matches the folder {path}; the globs must match TFRecord files only")
            if path in seen:
                repeated.append(path)
                continue
            seen.add(path)
            files.append(path)
    if repeated:
        log.warning(
            "%s: %d file(s) matched by more than one glob are read once: %s%s <%s>",
            key,
            len(repeated),
            ", ".join(repeated[:3]),
            " ..." if len(repeated) > 3 else "",
            key,
        )
    return files


def detect_compression(path: str) -> str | None:
    """`none`, `gzip` or `zlib` from a file's first bytes; None when it is none of them.

    An uncompressed TFRecord file starts with a record length whose checksum follows
    it, which a compressed file's first 12 bytes match only by a 1 in 2**32 chance.
    """
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            head = handle.read(12)
    except tf.errors.OpError as error:
        raise DataError(f"{path}: cannot read it ({first_line(error)})") from None
    if not head:
        return "none"  # empty: reported as "holds no records"
    if len(head) == 12 and struct.unpack("<I", head[8:])[0] == record_writer.masked_crc(head[:8]):
        return "none"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def compression_of(files: list[str], setting: str) -> str:
    """The TFRecordDataset `compression_type` for `files` under `dataset.compression=setting`.

    Raises:
        DataError: a file's first bytes disagree with the setting, match no known layout, or
            (`auto`) the files mix compressions.
    """
    found = {}
    for path in files:
        kind = detect_compression(path)
        if kind is None:
            raise DataError(
                f"{path}: not a TFRecord file, uncompressed or GZIP/ZLIB-compressed (its first bytes match none)"
            )
        if setting not in ("auto", kind):
            raise DataError(
                f"{path}: is {'uncompressed' if kind == 'none' else kind.upper() + '-compressed'} but "
                f"dataset.compression={setting}; set dataset.compression={kind} (or auto)"
            )
        found.setdefault(kind, path)
    if len(found) > 1:
        described = ", ".join(f"{path} is {kind}" for kind, path in found.items())
        raise DataError(f"files of one split mix compressions ({described}); convert them to one")
    return TF_COMPRESSION[next(iter(found), "none")]


def without_empty(paths: list[str], spec: RecordSpec, key: str, first=None) -> dict[str, bool]:
    """{path: labeled} of the files of `paths` that hold records, each told by `first` (`inspect_first`: its
    first record checked); an empty file is left out with a warning (TensorFlow reads it as zero records).

    Raises:
        DataError: a file fails `inspect_first`, or every file is empty.
    """
    kept = {}
    for path in paths:
        labeled = (first or inspect_first)(path, spec)
        if labeled is None:
            log.warning("%s holds no records: read as none <%s>", path, key)
        else:
            kept[path] = labeled
    if paths and not kept:
        raise DataError(
            f"{key}: every file holds no records ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})"
        )
    return kept


def first_line(error: tf.errors.OpError) -> str:
    """An op error's first line as we show it: without TensorFlow's `{{function_node ...}}` prefix and its
    `[Op:...]` suffix."""
    text = error.message.splitlines()[0] if error.message else type(error).__name__
    text = re.sub(r"\s*\[Op:[^\]]*\].*|Name: <unknown>, ", "", TF_FUNCTION_NODE.sub("", text)).strip()
    return text or type(error).__name__


FIRST_LOOK = 64  # records read to find a file's first Example


def first_example(path: str, spec: RecordSpec) -> tf.train.Example | None:
    """The first record of a file that parses as an Example, among its first `FIRST_LOOK`; None when none does
    (or the file has no records, or a broken frame comes first)."""
    records = tf.data.TFRecordDataset(path, compression_type=compression_of([path], spec.compression))
    try:
        for record in records.take(FIRST_LOOK):
            try:
                return tf.train.Example.FromString(record.numpy())
            except DecodeError:
                continue
    except tf.errors.OpError:
        return None
    return None


def first_labeled(path: str, spec: RecordSpec) -> bool | None:
    """Whether a file's records are labeled, told by its first Example (no Example among the first records: not
    labeled); None for a file with no records. Unlike `inspect_first` it judges no record: `mode=predict`
    gives every refused record its row, the first as any other."""
    records = tf.data.TFRecordDataset(path, compression_type=compression_of([path], spec.compression))
    try:
        if next(iter(records.take(1)), None) is None:
            return None
    except tf.errors.OpError:
        return False  # a broken first frame: its row says so
    example = first_example(path, spec)
    return example is not None and spec.label_key in example.features.feature


def inspect_first(path: str, spec: RecordSpec) -> bool | None:
    """Checks the first record of a file against `spec`; returns whether it is labeled, or None for a file
    that holds no records (0 bytes, or a compressed file with none: Beam and Spark write such shards).

    Raises:
        DataError: the file is unreadable, compressed otherwise than `spec.compression`, or its first
            record is not an Example or has the wrong keys or image size.
    """
    compression = compression_of([path], spec.compression)
    try:
        first = next(iter(tf.data.TFRecordDataset(path, compression_type=compression).take(1)), None)
    except tf.errors.OpError as error:
        raise DataError(f"{path}: not a readable TFRecord file ({first_line(error)})") from None
    if first is None:
        return None
    try:
        example = tf.train.Example.FromString(first.numpy())
    except DecodeError as error:
        raise DataError(f"{path}: record 0 is not a tf.train.Example ({error})") from None
    features = example.features.feature
    if spec.image_key not in features:
        raise DataError(
            f"{path}: record 0 has no '{spec.image_key}' feature; keys: {sorted(features)} "
            f"(set dataset.format or dataset.image_key)"
        )
    values = features[spec.image_key].bytes_list.value
    if len(values) != 1 or not values[0]:
        raise DataError(f"{path}: record 0 '{spec.image_key}' must hold one non-empty byte string; it holds none")
    if spec.format == "raw" and len(values[0]) != spec.raw_bytes:
        raise DataError(
            f"{path}: record 0 '{spec.image_key}' holds {len(values[0])} bytes, expected "
            f"{spec.stored_size}x{spec.stored_size}x3 = {spec.raw_bytes} (set dataset.stored_size)"
        )
    return spec.label_key in features


def scan_file(path: str, spec: RecordSpec, num_classes: int | None = None) -> int:
    """Reads a whole file once: every checksum, and (given `num_classes`) every label's range.

    Returns:
        The number of records.

    Raises:
        DataError: naming the file and record: a corrupted or truncated record, a record that
            is not an Example, a label outside [0, num_classes).
    """
    description = {spec.label_key: tf.io.FixedLenFeature([], tf.int64)} if num_classes is not None else {}
    compression = compression_of([path], spec.compression)
    batches = iter(tf.data.TFRecordDataset(path, compression_type=compression).batch(SCAN_BATCH))
    count = 0
    while True:
        try:
            batch = next(batches, None)
        except tf.errors.OpError as error:
            bad = count + _readable_records(path, compression, count)
            raise DataError(
                f"{path}: corrupted or truncated TFRecord file at record {bad} ({first_line(error)})"
            ) from None
        if batch is None:
            return count
        if num_classes is not None:
            labels = _parse_checked(path, batch, description, count)[spec.label_key].numpy()
            bad = ((labels < 0) | (labels >= num_classes)).nonzero()[0]
            if len(bad):
                raise DataError(
                    f"{path}: record {count + int(bad[0])} has label {int(labels[bad[0]])}, "
                    f"expected 0 to {num_classes - 1} (dataset.num_classes={num_classes})"
                )
        count += int(batch.shape[0])


def decode_each(serialized: list[bytes], decoder) -> tuple[tf.Tensor | None, list[str | None]]:
    """The images of the records that the pipeline's `decoder` takes (all at once, else one by one), and for
    each record None or the reason it refuses it."""
    if not serialized:
        return None, []
    try:
        return decoder(tf.constant(serialized))[0], [None] * len(serialized)
    except tf.errors.InvalidArgumentError:
        pass
    images, reasons = [], []
    for record in serialized:
        try:
            images.append(decoder(tf.constant([record]))[0])
            reasons.append(None)
        except tf.errors.InvalidArgumentError as error:
            reasons.append(first_line(error))
    return (tf.concat(images, 0) if images else None), reasons


def find_undecodable(path: str, spec: RecordSpec, decoder) -> None:
    """Decodes every record of a file with the pipeline's own `decoder`.

    Raises:
        DataError: naming the file and the first record the decoder refuses (an image feature that is
            missing, empty, repeated or of the wrong length; a JPEG that does not decode), with its reason.
    """
    compression = compression_of([path], spec.compression)
    count = 0
    for batch in tf.data.TFRecordDataset(path, compression_type=compression).batch(SCAN_BATCH):
        _, reasons = decode_each(list(batch.numpy()), decoder)
        for offset, refused in enumerate(reasons):
            if refused:
                raise DataError(f"{path}: record {count + offset} cannot be decoded: {refused}")
        count += len(reasons)


def _readable_records(path: str, compression: str, start: int) -> int:
    """How many records after the first `start` read before the error (only run once a read has failed)."""
    count = 0
    try:
        for _ in tf.data.TFRecordDataset(path, compression_type=compression).skip(start):
            count += 1
    except tf.errors.OpError:
        pass
    return count


def _parse_checked(path: str, batch: tf.Tensor, description: dict, first: int) -> dict:
    """`parse_example` of a batch; on failure, parses record by record to name the one at fault."""
    # TensorFlow quotes the bad record in its message, which Python then fails to decode: both mean "bad record".
    try:
        return tf.io.parse_example(batch, description)
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        pass
    for offset, record in enumerate(batch):
        try:
            tf.io.parse_single_example(record, description)
        except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as error:
            reason = first_line(error) if isinstance(error, tf.errors.OpError) else "not a valid Example"
            raise DataError(
                f"{path}: record {first + offset} does not parse as an Example with {sorted(description)} "
                f"({reason}); check dataset.label_key/filename_key"
            ) from None
    raise DataError(f"{path}: records {first} to {first + len(batch) - 1} do not parse")


def scan_records(path: str, spec: RecordSpec | None = None, num_classes: int | None = None) -> int:
    """Records in a file, every checksum checked (and every label, given `num_classes`).

    Raises:
        DataError: the file is corrupted or truncated, or a label is out of range.
    """
    return scan_file(path, spec or RecordSpec(), num_classes)


def read_manifest(files: list[str]) -> tuple[str | None, dict | None]:
    """(path, content) of the converter's manifest.json beside the first file, if there is one.

    Raises:
        DataError: the manifest is not valid JSON.
    """
    candidate = f"{os.path.dirname(files[0]) or '.'}/manifest.json"
    if not tf.io.gfile.exists(candidate):
        return None, None
    with tf.io.gfile.GFile(candidate, "r") as handle:
        text = handle.read()
    try:
        return candidate, json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{candidate}: not valid JSON ({error})") from None
