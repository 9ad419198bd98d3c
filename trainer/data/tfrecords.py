"""TFRecord image files: the feature spec shared by the writer (`trainer.data.folder_to_records`) and the reader,
and the checks of the files themselves (globs, compression, first record, every record's checksum and label, the
records up to a broken frame: `numbered_batches`, for predict, the start-up scan and the data check alike).

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
import struct
from collections.abc import Iterator

import tensorflow as tf
from google.protobuf.message import DecodeError

from trainer.data import record_writer
from trainer.data.check import record_entry, record_line, unreadable
from trainer.data.decoders import COMPRESSIONS, RecordSpec, TFRecordDecoder  # noqa: F401 (the spec, read here)
from trainer.data.shares import Records
from trainer.data.sources import Source, tfrecord_dataset
from trainer.errors import DataError, one_line

log = logging.getLogger(__name__)

TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}  # our names -> TFRecordDataset's compression_type
SCAN_BATCH = 1024  # records parsed at once when counting and checking a file


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
            raise DataError(f"{key}: cannot list {pattern} ({one_line(error)})") from None
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
    it, which a compressed file's first 12 bytes match only by a 1 in 2**32 chance; where that checksum fails,
    a second frame whose checksum holds (`_second_frame_fits`) still tells an uncompressed file, whose first
    frame is broken (a byte flipped in the length field itself is not told: "match none").
    """
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            head = handle.read(12)
    except tf.errors.OpError as error:
        raise DataError(f"{path}: cannot read it ({one_line(error)})") from None
    if not head:
        return "none"  # empty: reported as "holds no records"
    if len(head) == 12 and struct.unpack("<I", head[8:])[0] == record_writer.masked_crc(head[:8]):
        return "none"
    if len(head) == 12 and _second_frame_fits(path, struct.unpack("<Q", head[:8])[0]):
        return "none"  # its first frame is broken: read as a TFRecord file, that record is named as corrupted
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def _second_frame_fits(path: str, length: int) -> bool:
    """Whether the first frame's length (its checksum failed) leads to the file's end or to a second frame whose
    length checksum holds: an uncompressed TFRecord file whose first frame is broken (its checksum bytes, or its
    data), not another kind of file."""
    try:
        size = tf.io.gfile.stat(path).length
        if 16 + length >= size:
            return 16 + length == size
        with tf.io.gfile.GFile(path, "rb") as handle:
            handle.seek(16 + length)
            head = handle.read(12)
    except tf.errors.OpError:
        return False
    return len(head) == 12 and struct.unpack("<I", head[8:])[0] == record_writer.masked_crc(head[:8])


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


FIRST_LOOK = 64  # records read to find a file's first Example


def records_of(path: str, spec: RecordSpec) -> tf.data.Dataset:
    """Every record of one file, read as `spec.compression` says (checked against its first bytes)."""
    return tfrecord_dataset(path, compression_of([path], spec.compression))


class BrokenFile(DataError):
    """A corrupted or truncated frame: TFRecord frames cannot be re-synchronized after it. `quiet`: found by the
    file's bytes only (a frame cut inside its 12-byte header), where TensorFlow's read ends without an error, so a
    pipeline reading the file just gets fewer records."""

    def __init__(self, path: str, number: int, exact: bool, quiet: bool = False):
        where = f"at record {number}" if exact else f"at or after record {number}"
        super().__init__(f"{path}: corrupted or truncated TFRecord file {where}")
        self.number, self.exact, self.quiet = number, exact, quiet


class RefusedFirst(DataError):
    """`inspect_first`: the first record is an Example the decoder refuses (its reason in the message); `labeled`:
    whether it holds the label feature, as the file's other records are taken to."""

    def __init__(self, message: str, labeled: bool):
        super().__init__(message)
        self.labeled = labeled


def numbered_batches(
    path: str, compression: str, batch_size: int, decode, start: int = 0, length: int = -1, broken=tf.errors.OpError
) -> Iterator:
    """`decode(numbers, records)` of each batch of the records [start, start + length) of one file (length -1: to its
    end; `compression` "", "GZIP" or "ZLIB"), numbered in the file: how a record keeps its provenance through tf.data.

    Raises:
        BrokenFile: at a corrupted or truncated frame (a `broken` error: the data check takes data-loss errors
            only), after the records before it: the batch it stopped is read again one record at a time, so those
            records are decoded too and the error names the first record that could not be read, exactly in an
            uncompressed file, "at or after" in a compressed one (the decompressor may have held back records before
            the damage). An uncompressed file read whole is also checked by its bytes, as TensorFlow ends a read
            quietly at a frame cut inside its 12-byte header: each record takes its length and 16 bytes of frame.
    """
    read, after = 0, start
    try:
        for decoded, end, size in _sized_batches(path, compression, batch_size, decode, start, length):
            yield decoded
            read, after = read + size, end
    except broken:
        rest = length - (after - start) if length >= 0 else -1
        try:
            for decoded, end, size in _sized_batches(path, compression, 1, decode, after, rest):
                yield decoded
                read, after = read + size, end
        except broken:
            raise BrokenFile(path, after, exact=not compression) from None
    if not compression and start == 0 and length < 0 and read != tf.io.gfile.stat(path).length:
        raise BrokenFile(path, after, exact=True, quiet=True)


def _sized_batches(path: str, compression: str, batch_size: int, decode, start: int, length: int) -> Iterator:
    """(`decode(numbers, records)`, the number after the batch's last record, its bytes framed) for each batch of
    the records [start, start + length) of one file."""
    records = tfrecord_dataset(path, compression).skip(start).take(length).enumerate(start)

    def sized(numbers: tf.Tensor, batch: tf.Tensor):
        return decode(numbers, batch), numbers[-1] + 1, tf.reduce_sum(tf.strings.length(batch) + 16)

    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False  # as in trainer.data.pipeline: no model thread to wait for at the end
    batches = records.batch(batch_size).map(sized, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    for decoded, end, size in batches.prefetch(1).with_options(options):
        yield decoded, int(end), int(size)


def first_example(path: str, spec: RecordSpec) -> tf.train.Example | None:
    """The first record of a file that parses as an Example, among its first `FIRST_LOOK`; None when none does
    (or the file has no records, or a broken frame comes first)."""
    try:
        for record in records_of(path, spec).take(FIRST_LOOK):
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
    gives every refused record its row, the first as any other. A broken first frame leaves no record to
    tell: True, so it takes no label from the other files (its one row says it is broken)."""
    try:
        if next(iter(records_of(path, spec).take(1)), None) is None:
            return None
    except tf.errors.OpError:
        return True
    example = first_example(path, spec)
    return example is not None and spec.label_key in example.features.feature


def inspect_first(path: str, spec: RecordSpec) -> bool | None:
    """Checks the first record of a file against `spec`; returns whether it is labeled, or None for a file
    that holds no records (0 bytes, or a compressed file with none: Beam and Spark write such shards).

    Raises:
        BrokenFile: its first frame is corrupted or truncated.
        DataError: the file is unreadable, compressed otherwise than `spec.compression`, or its first
            record is not an Example or has the wrong keys; `RefusedFirst`: the decoder refuses it (its reason).
    """
    try:
        first = next(iter(records_of(path, spec).take(1)), None)
    except tf.errors.DataLossError:
        raise BrokenFile(path, 0, exact=not compression_of([path], spec.compression)) from None
    except tf.errors.OpError as error:
        raise DataError(f"{path}: not a readable TFRecord file ({one_line(error)})") from None
    if first is None:
        return None
    try:
        features = tf.train.Example.FromString(first.numpy()).features.feature
    except DecodeError as error:
        raise DataError(f"{path}: record 0 is not a tf.train.Example ({error})") from None
    if spec.image_key not in features:
        raise DataError(
            f"{path}: record 0 has no '{spec.image_key}' feature; keys: {sorted(features)} "
            f"(set dataset.format or dataset.image_key)"
        )
    labeled = spec.label_key in features
    reason = TFRecordDecoder(spec, labeled=labeled).checked(first[tf.newaxis])[2][0].numpy().decode()
    if reason:
        raise RefusedFirst(f"{path}: record 0 {reason}", labeled)
    return labeled


def scan_records(path: str, spec: RecordSpec | None = None, num_classes: int | None = None) -> int:
    """Reads a whole file once: every checksum, and (given `num_classes`) every record's parse and label.

    Returns:
        The number of records.

    Raises:
        DataError: naming the file and record: a corrupted or truncated frame, a record that is not an
            Example, a label outside [0, num_classes), by the decoder's rules (`TFRecordDecoder.label_reasons`).
    """
    spec = spec or RecordSpec()
    decoder = TFRecordDecoder(spec, num_classes)
    reasons = decoder.label_reasons if num_classes is not None else lambda records: tf.fill(tf.shape(records), "")
    return refuse_first(path, spec, reasons)


def refuse_first(path: str, spec: RecordSpec, reasons_of) -> int:
    """Reads one file, each batch's `reasons_of(records)` in the graph, and returns its number of records.

    Raises:
        DataError: `FILE: record N REASON` for the first record with a reason (or a broken frame).
    """
    count = 0
    compression = compression_of([path], spec.compression)
    for numbers, reasons in numbered_batches(
        path, compression, SCAN_BATCH, lambda numbers, records: (numbers, reasons_of(records))
    ):
        bad = reasons.numpy().nonzero()[0]
        if len(bad):
            raise DataError(record_line(path, int(numbers[bad[0]]), reasons[bad[0]].numpy().decode()))
        count = int(numbers[-1]) + 1
    return count


def readable_rest(source: Source, after: tuple[str, int] | None) -> Iterator[tuple[Source | None, dict | None]]:
    """The data check's read of `source` past a data-loss error (a corrupted frame), range by range in order after
    the record `after` (file, number) read last (None: from the start): each range's readable records as a source
    (None: none), and the bad record where they stop (`check.unreadable`; None: none)."""
    ranges = list(source.records.ranges)
    if after is not None:
        file, number = after
        at = next(
            index
            for index, (path, start, length) in enumerate(ranges)
            if path == file and start <= number and (length < 0 or number < start + length)
        )
        path, start, length = ranges[at]
        ranges = [(path, number + 1, -1 if length < 0 else start + length - number - 1), *ranges[at + 1 :]]
    compression = getattr(source.reader, "compression_type", "")
    for path, start, length in ranges:
        count, entry = 0, None
        try:
            for numbers in numbered_batches(
                path, compression, SCAN_BATCH, lambda numbers, _: numbers, start, length, tf.errors.DataLossError
            ):
                count += len(numbers)
        except BrokenFile as broken:
            entry = record_entry(path, broken.number, unreadable(broken.exact))
        yield Source(Records(((path, start, count),), count), source.reader) if count else None, entry


def cuts_before(source: Source, after: tuple[str, int] | None) -> list[dict]:
    """The bad records (`check.record_entry`) of the files `source` read before the file of record `after`: a frame
    cut inside its header ended such a file's read quietly, and only reading its frames again finds it (behind a
    manifest, no file was read at start-up). `after` None: nothing was read, so no file before it."""
    if after is None:
        return []
    ranges = source.records.ranges
    earlier = ranges[: next(index for index, (path, _, _) in enumerate(ranges) if path == after[0])]
    return [entry for _, entry in readable_rest(Source(Records(earlier, 0), source.reader), None) if entry is not None]


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
