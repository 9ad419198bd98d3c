"""tf.data pipelines over fixed-length binary records: raw records -> batches of (image, label).

Records are batched while still raw bytes, then decoded and augmented a whole
batch at a time (see `trainer.data.augment`). Order is deterministic: files
are read in order, shuffling is seeded, and parallel maps keep their input
order, so one seed gives one example order every run.

    python run.py dataset=cifar trainer.batch_size=128
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from trainer.data.augment import Preprocess, decode_records, prepare_images, preprocess_batch, to_model_size
from trainer.data.records import RecordFormat, RecordSlice, count_records
from trainer.data.shares import WorkerShare

AUTOTUNE = tf.data.AUTOTUNE


def _options(sharded: bool = False) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # parallel maps must never reorder examples
    # Shard by element, not by file: the test split is a single file and the
    # train/val split is a slice across files, so FILE sharding cannot work.
    # A worker's own share (`trainer.data.shares`) is sharded already.
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.OFF if sharded else policy.DATA
    return options


def _decoded(source: RecordSlice | WorkerShare, fmt: RecordFormat, preprocess: Preprocess) -> tf.data.Dataset:
    """(image at image_size, label) per record, decoded and resized once, then kept in memory.

    For small datasets (digits, CIFAR) this leaves only the augmentation to run every epoch.
    """
    records = read_records(source, fmt).batch(1024)

    def decode(raw):
        images, labels = decode_records(raw, fmt)
        return to_model_size(images, preprocess.image_size), labels

    images = records.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()
    return images.apply(tf.data.experimental.assert_cardinality(source.count)).cache()


def _share_records(share: WorkerShare, fmt: RecordFormat) -> tf.data.Dataset:
    """The records of one worker's ranges, in file order: each range is a byte range of its file, so the
    records around it are never yielded, decoded or augmented (the bytes before it pass through TensorFlow's
    read buffer, those after it are not read)."""
    paths, headers, footers = [], [], []
    for path, start, length in share.ranges:
        count = count_records(path, fmt)
        paths.append(path)
        headers.append(start * fmt.record_bytes)
        footers.append(0 if length < 0 else (count - start - length) * fmt.record_bytes)
    ranges = tf.data.Dataset.from_tensor_slices((paths, tf.constant(headers, tf.int64), tf.constant(footers, tf.int64)))
    records = ranges.flat_map(
        lambda path, header, footer: tf.data.FixedLengthRecordDataset(path, fmt.record_bytes, header, footer)
    )
    return records.apply(tf.data.experimental.assert_cardinality(share.count))


def read_records(source: RecordSlice | WorkerShare, fmt: RecordFormat) -> tf.data.Dataset:
    """The raw records of a split or of one worker's share, in file order."""
    if isinstance(source, WorkerShare):
        return _share_records(source, fmt)
    records = tf.data.FixedLengthRecordDataset(list(source.files), fmt.record_bytes)
    # The file sizes give the count; stating it lets Keras size each epoch.
    records = records.skip(source.start).take(source.count).apply(tf.data.experimental.assert_cardinality(source.count))
    return records


def replayed_per_iterator(make: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
    """The endless dataset `make()` builds, built anew inside each iterator, so every iterator replays the
    same seeded passes from the first.

    `shuffle(seed=..., reshuffle_each_iteration=True)` draws each pass's order from a generator that the
    dataset object shares among all its iterators. Every iterator made of it before training (Keras
    peeking at an element, a strategy's wrapping, a sample for a report) moved training on to the next
    order, so one seed trained on other batches under another strategy. Built inside a one-element
    `flat_map`, the shuffles belong to the iterator; its passes still get a new order one after another.
    """
    endless = tf.data.Dataset.range(1).flat_map(lambda _: make())
    return endless.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))


def train_dataset(
    source: RecordSlice | WorkerShare,
    fmt: RecordFormat,
    preprocess: Preprocess,
    batch_size: int,
    seed: int,
    shuffle_buffer: int = 10000,
    cache: bool = False,
) -> tf.data.Dataset:
    """Shuffled, augmented, endless batches for `fit(steps_per_epoch=...)`.

    Args:
        source: The training records, or one worker's share of them (read `per_epoch` records a pass).
        fmt: Their layout.
        preprocess: Resize, augmentation and standardization.
        batch_size: Global batch size (a worker's share: the per-replica one); the last partial batch of
            each pass is dropped.
        seed: Seeds the shuffle order and every augmentation parameter.
        shuffle_buffer: Records held for shuffling.
        cache: Keep the decoded, resized images in memory after the first pass.

    Returns:
        A dataset of (float32 images [batch, size, size, 3], int32 labels [batch]).
    """
    records = _decoded(source, fmt, preprocess) if cache else read_records(source, fmt)

    def passes():
        # Shuffle, then repeat: one epoch's records are all seen before the next
        # epoch starts, and each pass gets a new (seeded) order.
        shuffled = records.shuffle(min(shuffle_buffer, source.count), seed=seed, reshuffle_each_iteration=True)
        if isinstance(source, WorkerShare):  # the same steps on every worker: its passes line up with the epochs
            shuffled = shuffled.take(source.per_epoch)
        return shuffled.repeat()

    batches = replayed_per_iterator(passes).batch(batch_size, drop_remainder=True)
    # One stateless seed per batch; a different stream from the shuffle's.
    seeds = tf.data.Dataset.random(seed=seed + 1)

    def prepare(batch, batch_seed):
        if cache:  # already decoded: (images, labels)
            images, labels = batch
            return prepare_images(images, preprocess, batch_seed), labels
        return preprocess_batch(batch, fmt, preprocess, batch_seed)

    batches = tf.data.Dataset.zip((batches, seeds)).map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options(isinstance(source, WorkerShare)))


def eval_dataset(
    source: RecordSlice,
    fmt: RecordFormat,
    preprocess: Preprocess,
    batch_size: int,
    cache: bool = False,
) -> tf.data.Dataset:
    """Every record once, in file order, with the evaluation preprocessing (no augmentation)."""
    if cache:
        batches = (
            _decoded(source, fmt, preprocess)
            .batch(batch_size)
            .map(
                lambda images, labels: (prepare_images(images, preprocess), labels),
                num_parallel_calls=AUTOTUNE,
                deterministic=True,
            )
        )
    else:
        batches = (
            read_records(source, fmt)
            .batch(batch_size)
            .map(
                lambda raw: preprocess_batch(raw, fmt, preprocess),
                num_parallel_calls=AUTOTUNE,
                deterministic=True,
            )
        )
    return batches.prefetch(AUTOTUNE).with_options(_options())
