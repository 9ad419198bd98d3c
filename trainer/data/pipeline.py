"""The one input pipeline, for every format: records from a source -> shuffled batches -> decoded -> host preprocessing.

    python run.py dataset=cifar trainer.batch_size=128       # binary records
    python run.py dataset=cats_dogs                          # TFRecord shards, raw pixels or JPEG

A `Source` (`trainer.data.sources`) yields serialized records; a batch decoder
(`trainer.data.decoders`) turns a batch of them into uint8 images and int32 labels; the
host preprocessing (`trainer.data.preprocess`) resizes and crops them. This module owns
everything else once for every format: shuffling and its per-iterator replay, batching,
caching, the tf.data options and prefetch. It yields uint8 images at the model's input
size: the cast, the model's part of the augmentation and the normalization are layers
of the model.

Order is deterministic: files are read in order (or in a seeded order), shuffling is
seeded, and parallel maps keep their input order, so one seed gives one example order
every run.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from trainer.data.cache import Cache
from trainer.data.check import record_line
from trainer.data.decoders import Decoder, decode_batch
from trainer.data.mixing import Mixing, batch_mixer
from trainer.data.preprocess import Preprocess, prepare_images, to_model_size
from trainer.data.sources import Source
from trainer.errors import DataError

AUTOTUNE = tf.data.AUTOTUNE
CACHE_DECODE_BATCH = 1024  # records decoded at once when filling the cache


def _options(share: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # parallel reads and maps must never reorder examples
    # No autotune model thread: destroying an iterator (Keras does when `fit` returns) waited for that thread's
    # next wake-up, up to 60 s, because it sleeps out its optimization period without being woken (TF 2.21:
    # the main thread in ~LogicalThreadWrapper, the model thread in Model::OptimizeLoop's timed wait). Without
    # the model, AUTOTUNE maps run one call per core and prefetches use the legacy adaptive buffer: the
    # pipeline rows of `python -m benchmarks` measure the same rates.
    # Ledger: docs/development.md "Workarounds of upstream bugs"; canary: tests/test_upstream_canaries.py.
    options.autotune.enabled = False
    # Shard by element, not by file: a split may be a single file or a range across files, so FILE sharding
    # cannot work. A worker's own share (`trainer.data.shares`) is sharded already.
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = policy.OFF if share else policy.DATA
    return options


def _cached(source: Source, decoder: Decoder, preprocess: Preprocess, cache: Cache) -> tf.data.Dataset:
    """(image at image_size, label) per record, decoded and resized once, then kept as `cache` says (in memory,
    on disk): every later epoch, run or trial only reads and augments them."""

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def decode(files, numbers, records):
        images, labels = decode_batch(decoder, files, numbers, records)
        return to_model_size(images, preprocess.image_size), labels

    batches = source.in_order().batch(CACHE_DECODE_BATCH).map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    decoded = batches.unbatch().apply(tf.data.experimental.assert_cardinality(source.count))
    return cache.keep(decoded, source.records.ranges, source.count)


def replayed_per_iterator(make: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
    """The endless dataset `make()` builds, built anew inside each iterator, so every iterator replays the
    same seeded passes from the first.

    `shuffle(seed=..., reshuffle_each_iteration=True)` draws each pass's order from a generator that the
    dataset object shares among all its iterators. Every iterator made of it before training (Keras
    peeking at an element, a strategy's wrapping, a sample for a report) moved training on to the next
    order, so one seed trained on other batches under another strategy. Built inside a one-element
    `flat_map`, the shuffles belong to the iterator; its passes still get a new order one after another.
    """
    endless = tf.data.Dataset.range(1).flat_map(tf.autograph.experimental.do_not_convert(lambda _: make()))
    return endless.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))


def pass_batches(count: int, batch_size: int, replicas: int = 1) -> tuple[int, int]:
    """(batches in one pass over `count` records, records the pass leaves out). The last batch is kept, partial,
    as Keras's `fit` keeps it, cut to a multiple of `replicas` so that each replica gets an equal part of it (a
    replica's loss is the mean of its part): fewer than `replicas` records are left out, none on one replica."""
    last = count % batch_size
    left_out = last % replicas
    return count // batch_size + (last > left_out), left_out


def train_dataset(
    source: Source,
    decoder: Decoder,
    preprocess: Preprocess,
    batch_size: int,
    seed: int,
    shuffle_buffer: int = 1000,
    cache: Cache | None = None,
    mixing: Mixing | None = None,
    start_batch: int = 0,
    replicas: int = 1,
) -> tf.data.Dataset:
    """Shuffled, augmented, endless batches for `fit(steps_per_epoch=...)`.

    Args:
        source: The training records, or one worker's share of them (read `per_epoch` records a pass).
        decoder: A batch of records to (uint8 images, int32 labels).
        preprocess: Resize and the host's augmentation (crops).
        batch_size: Global batch size (a worker's share: the per-replica one). Each pass over the records ends
            with its last, partial batch (`pass_batches`), so an epoch of `pass_batches(...)[0]` steps sees every
            record once; a worker's share runs whole batches only (every worker the same steps).
        seed: Seeds the file order, the shuffle order and every augmentation parameter.
        shuffle_buffer: Records held for shuffling.
        cache: Where the decoded, resized images are kept after their first decode (`trainer.data.cache`).
        mixing: MixUp and CutMix of each batch (`trainer.data.mixing`), from the same batch seed.
        start_batch: Batches of the stream to pass over (a resumed run continues where its backup was made):
            their records are read and shuffled, not decoded or augmented.
        replicas: The replicas a global batch is split among: the last batch of a pass is cut to a multiple.

    Returns:
        A dataset of (uint8 images [batch, size, size, 3], int32 labels [batch]); with `mixing`, of (float32
        images, float32 soft labels [batch, classes]).
    """
    cached = _cached(source, decoder, preprocess, cache) if cache else None
    share = source.records.per_epoch

    def passes():
        # Shuffle, then repeat: one epoch's records are all seen before the next epoch starts, and each
        # pass gets a new (seeded) order.
        # A pass that holds another number of records than counted stops with tf.data's cardinality error
        # (`module.miscounted`; the part's `find_bad_record` names the file), as `Source.in_order` and the cache
        # do: a TFRecord file cut inside a frame's header ends its read quietly, short of its manifest's count. A
        # counter in the dataset op, no function per record. Here, not in `Source.for_training`: `own_parts`
        # checks a part's own reader by reading one record past its count, which the assertion would stop.
        counted = tf.data.experimental.assert_cardinality(source.count)
        records = cached if cache else source.for_training(seed).apply(counted)
        shuffled = records.shuffle(min(shuffle_buffer, source.count), seed=seed, reshuffle_each_iteration=True)
        if share is not None:  # the same whole steps on every worker: its passes line up with the epochs
            return shuffled.take(share).repeat().batch(batch_size, drop_remainder=True)
        # Each pass batched alone: it ends with its partial batch, so the passes line up with the epochs too.
        kept = source.count - pass_batches(source.count, batch_size, replicas)[1]
        return shuffled.take(kept).batch(batch_size).repeat()

    batches = replayed_per_iterator(passes)
    seeds = tf.data.Dataset.random(seed=seed + 1)  # one stateless seed per batch; another stream than the shuffle's

    mix = batch_mixer(mixing) if mixing else None

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def prepare(batch, batch_seed):
        images, labels = batch if cache else decode_batch(decoder, *batch)
        images = prepare_images(images, preprocess, batch_seed)
        return mix(images, labels, batch_seed) if mix else (images, labels)

    batches = tf.data.Dataset.zip((batches, seeds)).skip(start_batch)
    batches = batches.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options(share is not None))


def refuse_bad(source: Source, reasons_of: Callable[[tf.Tensor], tf.Tensor]) -> None:
    """Reads a source once, each batch's `reasons_of(records)` in the graph (start-up checks, `inspect.check`).

    Raises:
        DataError: `FILE: record N REASON` for the first record with a reason.
    """
    batches = source.in_order().batch(CACHE_DECODE_BATCH)
    check = tf.autograph.experimental.do_not_convert(
        lambda files, numbers, records: (files, numbers, reasons_of(records))
    )
    batches = batches.map(check)
    for files, numbers, reasons in batches.prefetch(1).with_options(_options(False)):
        bad = reasons.numpy().nonzero()[0]
        if len(bad):
            at = int(bad[0])
            raise DataError(record_line(files[at].numpy().decode(), int(numbers[at]), reasons[at].numpy().decode()))


def checked_dataset(source: Source, decoder: Decoder, preprocess: Preprocess, batch_size: int) -> tf.data.Dataset:
    """Every record once, in file order, as (images, labels, reasons, files, numbers) batches with the evaluation
    preprocessing: each record's reason ("" for a good one) from the decoder's `checked`, none raised, for the
    caller's policy (`inspect.check` counts and lists them). A decoder without `checked` raises its own error."""
    checked = getattr(decoder, "checked", None)

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def prepare(files, numbers, records):
        images, labels, reasons = checked(records) if checked else (*decoder(records), tf.fill(tf.shape(files), ""))
        return prepare_images(images, preprocess), labels, reasons, files, numbers

    batches = source.in_order().batch(batch_size).map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options(False))


def eval_dataset(
    source: Source, decoder: Decoder, preprocess: Preprocess, batch_size: int, cache: Cache | None = None
) -> tf.data.Dataset:
    """Every record once, in file order, with the evaluation preprocessing (resize, centre crop)."""
    records = _cached(source, decoder, preprocess, cache) if cache else source.in_order()

    @tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time (start-up)
    def prepare(*batch):  # (images, labels) from the cache, else (files, numbers, records)
        images, labels = batch if cache else decode_batch(decoder, *batch)
        return prepare_images(images, preprocess), labels

    batches = records.batch(batch_size).map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
    return batches.prefetch(AUTOTUNE).with_options(_options(False))
