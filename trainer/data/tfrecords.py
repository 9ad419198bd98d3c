"""TFRecord image datasets: the feature spec shared by the writer (`trainer.convert`) and the reader.

Two layouts:
- `raw`, the classic Cats-vs-Dogs recipe: `label` (int64) and `img_raw` (the
  height x width x 3 uint8 pixels), nothing else, so files written here and
  files users already have are interchangeable.
- `jpeg`, the TF Model Garden / TFDS keys: `image/encoded`, `image/class/label`,
  `image/filename`, `image/height`, `image/width`, `image/format`.

One reader, `tf.data`, for every file system TensorFlow knows (local disk, `gs://`,
`s3://`, `hdfs://`, `ram://`): `TFRecordDataset` (uncompressed, GZIP or ZLIB) batched,
then `tf.io.parse_example` and `decode_raw` on whole batches. Image and label come out
of one record, so they cannot drift apart. Under `strategy=multi_worker` each worker
reads only its own share (`trainer.data.shares`): whole files, or disjoint record ranges.

    python run.py dataset=cats_dogs dataset.data_dir=records/
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass

import tensorflow as tf
from google.protobuf.message import DecodeError

from trainer.data import pipeline, record_writer
from trainer.data.augment import Preprocess, prepare_images
from trainer.data.record_writer import DEFAULT_KEYS, FORMATS
from trainer.data.shares import Share, WorkerShare
from trainer.errors import DataError

log = logging.getLogger(__name__)

COMPRESSIONS = ("auto", "none", "gzip", "zlib")
TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}  # our names -> TFRecordDataset's compression_type
LABEL_MAX = 2**31 - 1  # labels are saturated to int32, so one past int32 still fails the range check
AUTOTUNE = tf.data.AUTOTUNE
MAX_PARALLEL_READS = 8  # files read at once
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
            raise DataError(f"{key}: cannot list {pattern} ({error.message.splitlines()[0]})") from None
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


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of `data` (a record's 8-byte length header here, so pure Python is fine)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def detect_compression(path: str) -> str | None:
    """`none`, `gzip` or `zlib` from a file's first bytes; None when it is none of them.

    An uncompressed TFRecord file starts with a record length whose checksum follows
    it, which a compressed file's first 12 bytes match only by a 1 in 2**32 chance.
    """
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            head = handle.read(12)
    except tf.errors.OpError as error:
        raise DataError(f"{path}: cannot read it ({error.message.splitlines()[0]})") from None
    if not head:
        return "none"  # empty: reported as "holds no records"
    if len(head) == 12 and struct.unpack("<I", head[8:])[0] == masked_crc32c(head[:8]):
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


def _first_line(error: tf.errors.OpError) -> str:
    return error.message.splitlines()[0] if error.message else type(error).__name__


def inspect_first(path: str, spec: RecordSpec) -> bool:
    """Checks the first record of a file against `spec`; returns whether it is labeled.

    Raises:
        DataError: the file is empty, unreadable, compressed otherwise than `spec.compression`,
            or its first record is not an Example or has the wrong keys or image size.
    """
    compression = compression_of([path], spec.compression)
    try:
        first = next(iter(tf.data.TFRecordDataset(path, compression_type=compression).take(1)), None)
    except tf.errors.OpError as error:
        raise DataError(f"{path}: not a readable TFRecord file ({_first_line(error)})") from None
    if first is None:
        raise DataError(f"{path}: holds no records")
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


@dataclass
class FileScan:
    """What one pass over a file found: its record count and each record's stored file name."""

    count: int
    filenames: list[str]


def _decode_name(name: bytes) -> str:
    return name.decode("utf-8", errors="backslashreplace")


def scan_file(path: str, spec: RecordSpec, num_classes: int | None = None, filenames: bool = False) -> FileScan:
    """Reads a whole file once: every checksum, and (given `num_classes`) every label's range.

    Raises:
        DataError: naming the file and record: a corrupted or truncated record, a record that
            is not an Example, a label outside [0, num_classes), a filename feature that is not bytes.
    """
    description = {}
    if num_classes is not None:
        description[spec.label_key] = tf.io.FixedLenFeature([], tf.int64)
    if filenames:
        description[spec.filename_key] = tf.io.FixedLenFeature([], tf.string, default_value=b"")
    compression = compression_of([path], spec.compression)
    batches = iter(tf.data.TFRecordDataset(path, compression_type=compression).batch(SCAN_BATCH))
    count, names = 0, []
    while True:
        try:
            batch = next(batches, None)
        except tf.errors.OpError as error:
            bad = count + _readable_records(path, compression, count)
            raise DataError(
                f"{path}: corrupted or truncated TFRecord file at record {bad} ({_first_line(error)})"
            ) from None
        if batch is None:
            return FileScan(count, names)
        parsed = _parse_checked(path, batch, description, count) if description else {}
        if num_classes is not None:
            labels = parsed[spec.label_key].numpy()
            bad = ((labels < 0) | (labels >= num_classes)).nonzero()[0]
            if len(bad):
                raise DataError(
                    f"{path}: record {count + int(bad[0])} has label {int(labels[bad[0]])}, "
                    f"expected 0 to {num_classes - 1} (dataset.num_classes={num_classes})"
                )
        if filenames:
            names += [_decode_name(name) for name in parsed[spec.filename_key].numpy()]
        count += int(batch.shape[0])


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
            reason = _first_line(error) if isinstance(error, tf.errors.OpError) else "not a valid Example"
            raise DataError(
                f"{path}: record {first + offset} does not parse as an Example with {sorted(description)} "
                f"({reason}); check dataset.label_key/filename_key"
            ) from None
    raise DataError(f"{path}: records {first} to {first + len(batch) - 1} do not parse")


def count_records(path: str, spec: RecordSpec | None = None, num_classes: int | None = None) -> int:
    """Records in a file, every checksum checked (and every label, given `num_classes`).

    Raises:
        DataError: the file is corrupted or truncated, or a label is out of range.
    """
    return scan_file(path, spec or RecordSpec(), num_classes).count


def _parse(serialized: tf.Tensor, spec: RecordSpec, labeled: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """A batch of serialized examples to (image bytes, int32 labels); unlabeled records get label -1."""
    description = {spec.image_key: tf.io.FixedLenFeature([], tf.string)}
    if labeled:
        description[spec.label_key] = tf.io.FixedLenFeature([], tf.int64)
    parsed = tf.io.parse_example(serialized, description)
    encoded = parsed[spec.image_key]
    if labeled:  # saturated, not wrapped: a label past int32 must still fail the range check
        labels = tf.cast(tf.clip_by_value(parsed[spec.label_key], -1, LABEL_MAX), tf.int32)
    else:
        labels = -tf.ones(tf.shape(encoded), tf.int32)
    return encoded, labels


def _decode_raw(encoded: tf.Tensor, spec: RecordSpec) -> tf.Tensor:
    tf.debugging.assert_equal(
        tf.strings.length(encoded),
        spec.raw_bytes,
        message=f"'{spec.image_key}' is not {spec.stored_size}x{spec.stored_size}x3 bytes (dataset.stored_size)",
    )
    return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [-1, spec.stored_size, spec.stored_size, 3])


def _decode_jpeg(data: tf.Tensor, size: int) -> tf.Tensor:
    """One JPEG to uint8 size x size x 3 (resized only if stored at another size)."""
    image = tf.io.decode_jpeg(data, channels=3)
    same = tf.reduce_all(tf.equal(tf.shape(image)[:2], size))
    image = tf.cond(
        same, lambda: image, lambda: tf.cast(tf.image.resize(image, [size, size], antialias=True) + 0.5, tf.uint8)
    )
    return tf.ensure_shape(image, [size, size, 3])


def image_batches(
    records: tf.data.Dataset, spec: RecordSpec, labeled: bool, batch_size: int, drop_remainder: bool = False
) -> tf.data.Dataset:
    """Serialized records to batches of (uint8 images, labels), each image with the label of its own record.

    Whole batches are parsed at once (`parse_example`); raw pixels are decoded per
    batch in the same step, JPEGs one by one in parallel (order kept) and then batched again.
    """
    batches = records.batch(batch_size, drop_remainder=drop_remainder)
    if spec.format == "raw":

        def parse_and_decode(serialized):
            encoded, labels = _parse(serialized, spec, labeled)
            return _decode_raw(encoded, spec), labels

        return batches.map(parse_and_decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    parsed = batches.map(
        lambda serialized: _parse(serialized, spec, labeled), num_parallel_calls=AUTOTUNE, deterministic=True
    )
    singles = parsed.unbatch().map(
        lambda data, label: (_decode_jpeg(data, spec.stored_size), label),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    return singles.batch(batch_size, drop_remainder=drop_remainder)


def shuffled_records(
    files: list[str] | list[Share],
    seed: int,
    shuffle_buffer: int = 1000,
    compression: str = "",
    per_pass: int | None = None,
) -> tf.data.Dataset:
    """Serialized records, endlessly: shards in a seeded order, read in parallel (deterministically) and shuffled.

    `files` are paths, or one worker's shares (record ranges of files, `trainer.data.shares`);
    `per_pass`: only that many records of each pass (a worker's records per epoch).
    """
    shares = [(item, 0, -1) if isinstance(item, str) else tuple(item) for item in files]
    paths, starts, lengths = (list(column) for column in zip(*shares, strict=True))
    reads = min(len(paths), MAX_PARALLEL_READS)
    whole_files = all(start == 0 and length == -1 for _, start, length in shares)

    def read(path, start, length):  # skip walks record headers; nothing before `start` is parsed or decoded
        return tf.data.TFRecordDataset(path, compression_type=compression).skip(start).take(length)

    def passes():
        if whole_files:
            order = tf.data.Dataset.from_tensor_slices(paths)
            order = order.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
            records = tf.data.TFRecordDataset(order, compression_type=compression, num_parallel_reads=reads)
        else:
            ranges = (paths, tf.constant(starts, tf.int64), tf.constant(lengths, tf.int64))
            order = tf.data.Dataset.from_tensor_slices(ranges)
            order = order.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
            records = order.interleave(read, cycle_length=reads, num_parallel_calls=AUTOTUNE, deterministic=True)
        # Shuffle, then repeat: every record of an epoch is seen before the next epoch starts.
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return (records if per_pass is None else records.take(per_pass)).repeat()

    return pipeline.replayed_per_iterator(passes)


def read_batches(
    files: list[str] | WorkerShare, spec: RecordSpec, batch_size: int, seed: int, shuffle_buffer: int = 1000
) -> tf.data.Dataset:
    """The training reader: endless shuffled batches of (uint8 images, int32 labels), before augmentation.

    A worker's share is read `per_epoch` records a pass, so its passes line up with the epochs.
    """
    ranges, per_pass = (list(files.ranges), files.per_epoch) if isinstance(files, WorkerShare) else (files, None)
    paths = sorted({item if isinstance(item, str) else item[0] for item in ranges})
    records = shuffled_records(ranges, seed, shuffle_buffer, compression_of(paths, spec.compression), per_pass)
    return image_batches(records, spec, True, batch_size, drop_remainder=True)


def _options(shard_policy=tf.data.experimental.AutoShardPolicy.DATA) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # parallel reads and maps keep a fixed order
    options.experimental_distribute.auto_shard_policy = shard_policy
    return options


def _check_labels(labels: tf.Tensor, num_classes: int) -> tf.Tensor:
    tf.debugging.assert_less(labels, num_classes, message=f"a record has a label >= num_classes={num_classes}")
    tf.debugging.assert_non_negative(labels, message="a record has a negative label")
    return labels


def train_dataset(
    files: list[str] | WorkerShare,
    spec: RecordSpec,
    preprocess: Preprocess,
    num_classes: int,
    batch_size: int,
    seed: int,
    shuffle_buffer: int = 1000,
) -> tf.data.Dataset:
    """`read_batches`, then every batch augmented with its own seed.

    `files` may be one worker's share (`trainer.data.shares`); such a pipeline is already
    sharded, so tf.distribute must not shard it again.
    """
    images = read_batches(files, spec, batch_size, seed, shuffle_buffer)
    batches = tf.data.Dataset.zip((images, tf.data.Dataset.random(seed + 1)))

    def prepare(pair, batch_seed):
        images, labels = pair
        return prepare_images(images, preprocess, batch_seed), _check_labels(labels, num_classes)

    sharded = isinstance(files, WorkerShare)
    policy = tf.data.experimental.AutoShardPolicy.OFF if sharded else tf.data.experimental.AutoShardPolicy.DATA
    return (
        batches.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
        .prefetch(AUTOTUNE)
        .with_options(_options(policy))
    )


def eval_dataset(
    files: list[str],
    spec: RecordSpec,
    preprocess: Preprocess,
    num_classes: int,
    batch_size: int,
    labeled: bool = True,
    count: int | None = None,
    check_labels: bool = True,
) -> tf.data.Dataset:
    """Every record once, files in the given order, with the evaluation preprocessing."""
    records = tf.data.TFRecordDataset(files, compression_type=compression_of(files, spec.compression))  # in order
    if count is not None:
        records = records.apply(tf.data.experimental.assert_cardinality(count))
    images = image_batches(records, spec, labeled, batch_size)

    def prepare(images, labels):
        checked = _check_labels(labels, num_classes) if labeled and check_labels else labels
        return prepare_images(images, preprocess), checked

    batches = images.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options())


def read_filenames(files: list[str], spec: RecordSpec) -> list[str]:
    """The file name stored in each record (empty where none), in input order; names that are not
    valid UTF-8 keep their bytes as backslash escapes."""
    return [name for path in files for name in scan_file(path, spec, filenames=True).filenames]


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
