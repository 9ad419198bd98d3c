"""TFRecord image datasets: the feature spec shared by the writer (`trainer.convert`) and the reader.

Two layouts:
- `raw`, the classic Cats-vs-Dogs recipe: `label` (int64) and `img_raw` (the
  height x width x 3 uint8 pixels), nothing else, so files written here and
  files users already have are interchangeable.
- `jpeg`, the TF Model Garden / TFDS keys: `image/encoded`, `image/class/label`,
  `image/filename`, `image/height`, `image/width`, `image/format`.

Image and label come out of one record, so they cannot drift apart: raw records on
a local disk through `record_index` (each image copied once, from the file into its
batch); JPEG records and remote files through `TFRecordDataset` and `tf.io.parse_example`
on whole batches.

    python run.py dataset=cats_dogs dataset.data_dir=records/
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from trainer.data.augment import Preprocess, prepare_images
from trainer.data.record_index import LABEL_MAX, RecordIndex
from trainer.errors import DataError

FORMATS = ("raw", "jpeg")
DEFAULT_KEYS = {
    "raw": {"image": "img_raw", "label": "label", "filename": "filename"},
    "jpeg": {"image": "image/encoded", "label": "image/class/label", "filename": "image/filename"},
}
AUTOTUNE = tf.data.AUTOTUNE


@dataclass(frozen=True)
class RecordSpec:
    """How images are stored in the records."""

    format: str = "raw"  # raw | jpeg
    stored_size: int = 224  # raw: side of the stored square image
    image_key: str = "img_raw"
    label_key: str = "label"
    filename_key: str = "filename"

    @classmethod
    def for_format(cls, format: str, stored_size: int = 224, **keys: str | None) -> RecordSpec:
        """The spec with the default keys of `format`, overridden by any non-empty `keys`."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}. Received: format={format}")
        chosen = {**DEFAULT_KEYS[format], **{name: key for name, key in keys.items() if key}}
        return cls(format, stored_size, chosen["image"], chosen["label"], chosen["filename"])

    @property
    def raw_bytes(self) -> int:
        return self.stored_size * self.stored_size * 3


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def make_example(
    spec: RecordSpec, image: bytes, label: int | None, filename: str | None, height: int, width: int
) -> bytes:
    """One serialized `tf.train.Example`.

    `image` is the raw pixels (raw) or the encoded JPEG (jpeg). A labeled raw
    example holds exactly `label` and `img_raw`, as the classic recipe does.
    """
    features = {spec.image_key: _bytes(image)}
    if label is not None:
        features[spec.label_key] = _int64(label)
    if spec.format == "jpeg":
        features["image/height"] = _int64(height)
        features["image/width"] = _int64(width)
        features["image/format"] = _bytes(b"jpeg")
    if filename is not None and (spec.format == "jpeg" or label is None):
        features[spec.filename_key] = _bytes(filename.encode())
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def expand(patterns: list[str] | str, key: str) -> list[str]:
    """The files matched by a glob or list of globs, sorted per pattern.

    Raises:
        DataError: a pattern matches no file.
    """
    files = []
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        matched = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matched:
            raise DataError(f"{key}: {pattern} matches no file")
        files += matched
    return files


def inspect_first(path: str, spec: RecordSpec) -> bool:
    """Checks the first record of a file against `spec`; returns whether it is labeled.

    Raises:
        DataError: the file is empty, unreadable, or its first record has the wrong keys or image size.
    """
    try:
        first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise DataError(f"{path}: not a readable TFRecord file ({error.message.splitlines()[0]})") from None
    if first is None:
        raise DataError(f"{path}: holds no records")
    example = tf.train.Example.FromString(first.numpy())
    features = example.features.feature
    if spec.image_key not in features:
        raise DataError(
            f"{path}: record 0 has no '{spec.image_key}' feature; keys: {sorted(features)} "
            f"(set dataset.format or dataset.image_key)"
        )
    if spec.format == "raw":
        length = len(features[spec.image_key].bytes_list.value[0])
        if length != spec.raw_bytes:
            raise DataError(
                f"{path}: record 0 '{spec.image_key}' holds {length} bytes, expected "
                f"{spec.stored_size}x{spec.stored_size}x3 = {spec.raw_bytes} (set dataset.stored_size)"
            )
    return spec.label_key in features


def count_records(path: str) -> int:
    """Reads a whole file once, checking every record's checksum.

    Raises:
        DataError: the file is corrupted or truncated.
    """
    try:
        return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise DataError(f"{path}: corrupted or truncated TFRecord file ({error.message.splitlines()[0]})") from None


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


def indexed(spec: RecordSpec, files: list[str]) -> bool:
    """Whether `record_index` reads these files: raw records on a local disk (of a system with `os.readv`)."""
    return spec.format == "raw" and hasattr(os, "readv") and all("://" not in path for path in files)


@functools.lru_cache(maxsize=8)
def _built_index(files: tuple[str, ...], spec: RecordSpec, labeled: bool, stamps: tuple) -> RecordIndex:
    return RecordIndex.build(list(files), spec.image_key, spec.label_key, spec.raw_bytes, labeled)


def _index(files: list[str], spec: RecordSpec, labeled: bool, count: int | None = None) -> RecordIndex:
    """The index of `files`, built once per process while they are unchanged (the training reader and the
    in-order train split share it)."""
    stamps = tuple((stat.st_size, stat.st_mtime_ns) for stat in map(os.stat, files))
    index = _built_index(tuple(files), spec, labeled, stamps)
    if count is not None and len(index) != count:
        raise DataError(f"{', '.join(files)}: hold {len(index)} records, expected {count} (the manifest's count)")
    return index


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # interleave and parallel maps keep a fixed order
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options


def _check_labels(labels: tf.Tensor, num_classes: int) -> tf.Tensor:
    tf.debugging.assert_less(labels, num_classes, message=f"a record has a label >= num_classes={num_classes}")
    tf.debugging.assert_non_negative(labels, message="a record has a negative label")
    return labels


def shuffled_records(files: list[str], seed: int, shuffle_buffer: int = 1000) -> tf.data.Dataset:
    """Serialized records, endlessly: shards in a seeded order, read in parallel (deterministically) and shuffled."""
    shards = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    records = shards.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=AUTOTUNE, deterministic=True
    )
    # Shuffle, then repeat: every record of an epoch is seen before the next epoch starts.
    return records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()


def read_batches(
    files: list[str], spec: RecordSpec, batch_size: int, seed: int, shuffle_buffer: int = 1000
) -> tf.data.Dataset:
    """The training reader: endless shuffled batches of (uint8 images, int32 labels), before augmentation.

    Both readers visit records in the same way: shards in a seeded order, up to 8 interleaved, a shuffle buffer.
    """
    if indexed(spec, files):
        index = _index(files, spec, labeled=True)
        ids = index.shuffled_ids(seed, shuffle_buffer).batch(batch_size, drop_remainder=True)
        return index.batches(ids, spec.stored_size, spec.stored_size)
    return image_batches(shuffled_records(files, seed, shuffle_buffer), spec, True, batch_size, drop_remainder=True)


def train_dataset(
    files: list[str],
    spec: RecordSpec,
    preprocess: Preprocess,
    num_classes: int,
    batch_size: int,
    seed: int,
    shuffle_buffer: int = 1000,
) -> tf.data.Dataset:
    """`read_batches`, then every batch augmented with its own seed."""
    images = read_batches(files, spec, batch_size, seed, shuffle_buffer)
    batches = tf.data.Dataset.zip((images, tf.data.Dataset.random(seed + 1)))

    def prepare(pair, batch_seed):
        images, labels = pair
        return prepare_images(images, preprocess, batch_seed), _check_labels(labels, num_classes)

    return (
        batches.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
        .prefetch(AUTOTUNE)
        .with_options(_options())
    )


def eval_dataset(
    files: list[str],
    spec: RecordSpec,
    preprocess: Preprocess,
    num_classes: int,
    batch_size: int,
    labeled: bool = True,
    count: int | None = None,
) -> tf.data.Dataset:
    """Every record once, files in the given order, with the evaluation preprocessing."""
    # Sequential: input order.
    if indexed(spec, files):
        index = _index(files, spec, labeled, count)
        images = index.batches(tf.data.Dataset.range(len(index)).batch(batch_size), spec.stored_size, spec.stored_size)
    else:
        records = tf.data.TFRecordDataset(files)
        if count is not None:
            records = records.apply(tf.data.experimental.assert_cardinality(count))
        images = image_batches(records, spec, labeled, batch_size)

    def prepare(images, labels):
        return prepare_images(images, preprocess), (_check_labels(labels, num_classes) if labeled else labels)

    batches = images.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options())


def read_filenames(files: list[str], spec: RecordSpec) -> list[str]:
    """The file name stored in each record (empty where none), in input order."""
    description = {spec.filename_key: tf.io.FixedLenFeature([], tf.string, default_value=b"")}
    names = []
    for batch in tf.data.TFRecordDataset(files).batch(1024):
        names += [name.decode() for name in tf.io.parse_example(batch, description)[spec.filename_key].numpy()]
    return names


def manifest_path(files: list[str]) -> Path | None:
    """The converter's manifest.json beside the first file, if there is one."""
    candidate = Path(files[0]).parent / "manifest.json"
    return candidate if candidate.is_file() else None
