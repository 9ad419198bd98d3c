"""Input-pipeline rows: the CIFAR and TFRecord pipelines that ship against the textbook recipes, the workers'
shares, and the pipeline's memory.

    python -m benchmarks --only cifar_pipeline tfrecord_reader worker_shares memory
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT, Row, cifar_count, cifar_files, pet_records, side_by_side

# A target, not a measurement: the memory row compares the measured peak with this budget.
MEMORY_BUDGET_MIB = 1536.0  # the CIFAR pipeline must fit in 1.5 GiB (ImageNet-size shuffle buffers are out of scope)
CIFAR_HOST = dict(crop="random", crop_size=28)  # what conf/dataset/cifar.yaml does on the host
CIFAR_MODEL = dict(flip=True, brightness=63.0, contrast_lower=0.2, contrast_upper=1.8)  # ... and in the model


def _textbook_cifar(files, batch_size, seed):
    """The per-example recipe: parse, augment and standardize one image at a time, then batch."""
    import tensorflow as tf

    def parse(record):
        raw = tf.io.decode_raw(record, tf.uint8)
        image = tf.cast(tf.transpose(tf.reshape(raw[1:], [3, 32, 32]), [1, 2, 0]), tf.float32)
        image = tf.image.random_crop(image, [28, 28, 3])
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 63)
        image = tf.image.random_contrast(image, 0.2, 1.8)
        return tf.image.per_image_standardization(image), tf.cast(raw[0], tf.int32)

    records = tf.data.FixedLengthRecordDataset(files, 3073).shuffle(10000, seed=seed).repeat()
    return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _finish_on_host(dataset):
    """The same batches finished on the host, as before models owned their preprocessing: the model's flip,
    colour jitter and standardization layers applied in `tf.data`, float32 out (no run does this)."""
    import tensorflow as tf

    from trainer.data.augmentation import Augmentation
    from trainer.models.preprocessing import augmentation_layers, normalization_layer

    layers = [*augmentation_layers(Augmentation(**CIFAR_MODEL), seed=0), normalization_layer("standardize")]

    def finish(images, labels):
        images = tf.cast(images, tf.float32)
        for layer in layers:
            images = layer(images, training=True)
        return images, labels

    return dataset.map(finish, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def our_cifar(folder: Path, quick: bool):
    """(files, record count, the CIFAR train pipeline `dataset=cifar` builds, batch 128)."""
    from trainer.data import pipeline
    from trainer.data.augmentation import Augmentation
    from trainer.data.binary import BinaryLayout
    from trainer.data.decoders import BinaryDecoder
    from trainer.data.preprocess import Preprocess
    from trainer.data.shares import Records
    from trainer.data.sources import FixedLengthReader, Source

    count = cifar_count(quick)
    files = cifar_files(folder, count)
    layout = BinaryLayout(32, 32, 3)
    source = Source(Records.whole_files(files, count), FixedLengthReader(layout.record_bytes))
    preprocess = Preprocess(32, Augmentation(**CIFAR_HOST, **CIFAR_MODEL))
    return files, count, pipeline.train_dataset(source, BinaryDecoder(layout, 10), preprocess, 128, seed=0)


def cifar_pipeline(folder: Path, quick: bool) -> list[Row]:
    files, _, ours = our_cifar(folder, quick)
    seconds, rounds = (0.5, 1) if quick else (3.0, 2)
    shipped, textbook = side_by_side(ours, _textbook_cifar(files, 128, 0), seconds, rounds)
    uint8, float32 = side_by_side(ours, _finish_on_host(ours), seconds, rounds)
    return [
        Row(
            "CIFAR train pipeline as it ships (uint8 out; flip, colour, standardize in the model) vs textbook",
            shipped,
            textbook,
            "img/s",
            3.0,
        ),
        Row("  the same vs the same finished on the host (float32 out, as no run does)", uint8, float32, "img/s", None),
    ]


def _textbook_parse(format: str, augment: bool, size: int = 224):
    """The per-example recipe: `parse_single_example`, decode, and (if `augment`) flip and standardize one image."""
    import tensorflow as tf

    from trainer.data.record_writer import DEFAULT_KEYS

    keys = DEFAULT_KEYS[format]
    description = {
        keys["image"]: tf.io.FixedLenFeature([], tf.string),
        keys["label"]: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        example = tf.io.parse_single_example(serialized, description)
        if format == "raw":
            image = tf.reshape(tf.io.decode_raw(example[keys["image"]], tf.uint8), [size, size, 3])
        else:
            image = tf.io.decode_jpeg(example[keys["image"]], channels=3)
        if augment:
            image = tf.image.random_flip_left_right(tf.cast(image, tf.float32))
            image = tf.image.per_image_standardization(image)
        return image, tf.cast(example[keys["label"]], tf.int32)

    return parse


def _textbook_reader(files, format: str, batch_size: int, augment: bool):
    """The textbook's reading (the files one after another, then a shuffle buffer), per-example parsing."""
    import tensorflow as tf

    records = tf.data.TFRecordDataset(files).shuffle(256, seed=0).repeat()
    parsed = records.map(_textbook_parse(format, augment), num_parallel_calls=tf.data.AUTOTUNE)
    return parsed.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _handwritten_batched(files, format: str, batch_size: int, size: int = 224):
    """A plain batched tf.data train pipeline written by hand: parallel reads, shuffle, batch, parse_example,
    decode_raw: the host work ours does (its flip and standardization are layers of the model), without
    this project."""
    import tensorflow as tf

    from trainer.data.record_writer import DEFAULT_KEYS

    keys = DEFAULT_KEYS[format]
    description = {
        keys["image"]: tf.io.FixedLenFeature([], tf.string),
        keys["label"]: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        example = tf.io.parse_example(serialized, description)
        images = tf.reshape(tf.io.decode_raw(example[keys["image"]], tf.uint8), [-1, size, size, 3])
        return images, tf.cast(example[keys["label"]], tf.int32)

    records = tf.data.TFRecordDataset(files, num_parallel_reads=len(files)).shuffle(256, seed=0).repeat()
    batches = records.batch(batch_size, drop_remainder=True)
    return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _our_pets(files: list[str], format: str, count: int, batch_size: int = 32):
    """The train pipeline `dataset=cats_dogs` builds over the shards (no host augmentation), shuffle buffer 256."""
    from trainer.data import pipeline, tfrecords
    from trainer.data.decoders import TFRecordDecoder
    from trainer.data.preprocess import Preprocess
    from trainer.data.shares import Records
    from trainer.data.sources import Source, TFRecordReader

    spec = tfrecords.RecordSpec.for_format(format, 224)
    source = Source(Records.whole_files(files, count), TFRecordReader())
    return pipeline.train_dataset(source, TFRecordDecoder(spec, 2), Preprocess(224), batch_size, 0, 256)


def tfrecord_reader(folder: Path, quick: bool) -> list[Row]:
    """The TFRecord pipeline (tf.data only): raw records against the textbook per-example recipe and against a
    hand-written batched pipeline doing the same work; JPEG records reported."""
    seconds, rounds, count = (0.5, 1, 256) if quick else (3.0, 2, 1024)
    files = pet_records(folder, "raw", count)
    ours = _our_pets(files, "raw", count)
    jpeg = pet_records(folder, "jpeg", count)
    return [
        Row(
            "Cats-vs-Dogs raw train pipeline 224x224 (uint8 out; flip in the model) vs textbook per-example",
            *side_by_side(ours, _textbook_reader(files, "raw", 32, augment=True), seconds, rounds),
            "img/s",
            2.0,
        ),
        Row(
            "  the same vs a hand-written batched tf.data pipeline (same work)",
            *side_by_side(ours, _handwritten_batched(files, "raw", 32), seconds, rounds),
            "img/s",
            0.95,
        ),
        Row(
            "Cats-vs-Dogs JPEG train pipeline (decode_jpeg) vs textbook per-example",
            *side_by_side(_our_pets(jpeg, "jpeg", count), _textbook_reader(jpeg, "jpeg", 32, False), seconds, rounds),
            "img/s",
            None,
        ),
    ]


def _records_read(source) -> int:
    """Records one input pipeline's source yields over one epoch of its share."""
    return int(source.in_order().reduce(0, lambda total, _: total + 1))


def worker_shares(folder: Path, quick: bool) -> list[Row]:
    """Two workers: the records each one's pipeline reads per epoch against the dataset size. The shares are
    what `distribute_datasets_from_function` gives each worker's InputContext (tests/test_tfrecord_input.py and
    tests/test_worker_shares.py train two loopback workers on them)."""
    from trainer.data import shares, tfrecords
    from trainer.data.binary import BinaryLayout, records_by_size
    from trainer.data.sources import FixedLengthReader, Source, TFRecordReader

    count = 256 if quick else 1024
    rows = []
    for num_files, label in ((8, "whole files, 8 shards"), (1, "record ranges, 1 shard")):
        files = pet_records(folder, "raw", count, shards=num_files)
        counts = [tfrecords.scan_records(path) for path in files]
        plan = shares.plan(files, counts, 2, 16)
        most = max(_records_read(Source(worker, TFRecordReader())) for worker in plan.workers)
        rows.append(
            Row(f"2 workers: records read by the busiest / dataset ({label})", most, count, "records", 0.55, False)
        )
    # CIFAR-format .bin: 5 train files, the last 10% held out for validation (record ranges over the rest).
    layout, per_file = BinaryLayout(32, 32, 3), cifar_count(quick) // 5
    for index in range(5):
        (folder / f"part{index}").mkdir(exist_ok=True)
    files = [cifar_files(folder / f"part{index}", per_file)[0] for index in range(5)]
    train = 5 * per_file - per_file // 2
    plan = shares.plan(files, [records_by_size(path, layout) for path in files], 2, 64, limit=train)
    reader = FixedLengthReader(layout.record_bytes)
    most = max(_records_read(Source(worker, reader)) for worker in plan.workers)
    label = "CIFAR .bin, 5 files, validation held out"
    rows.append(
        Row(f"2 workers: records read by the busiest / train split ({label})", most, train, "records", 0.55, False)
    )
    return rows


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM). Not `ru_maxrss`: a child started by fork keeps its parent's maximum."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def measure_memory(folder: Path, quick: bool) -> tuple[float, list[float]]:
    """(peak RSS, RSS after each epoch) in MiB over 5 epochs of the CIFAR train pipeline, in this process."""
    _, count, dataset = our_cifar(folder, quick)
    steps = count // 128
    iterator = iter(dataset)
    after_epoch = []
    for _ in range(5):
        for _ in range(steps):
            next(iterator)
        after_epoch.append(_rss_mib())
    return _peak_rss_mib(), after_epoch


def memory(folder: Path, quick: bool) -> list[Row]:
    # A fresh process whose peak RSS holds only the pipeline: not this one's (making the data peaks at
    # twice the 154 MB file), nor, when the cases share a process, an earlier row's.
    cifar_files(folder, cifar_count(quick))
    probe = (
        "import pathlib, sys; from benchmarks.pipelines import measure_memory; "
        "print(measure_memory(pathlib.Path(sys.argv[1]), sys.argv[2] == '1'))"
    )
    command = [sys.executable, "-c", probe, str(folder), str(int(quick))]
    output = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    peak, after_epoch = ast.literal_eval(output.strip().splitlines()[-1])
    return [
        Row(
            "Memory: peak RSS, 5 epochs CIFAR pipeline (baseline column = the 1.5 GiB budget, a target)",
            peak,
            MEMORY_BUDGET_MIB,
            "MiB",
            1.0,
            higher_is_better=False,
        ),
        Row("Memory: RSS after epoch 5 vs after epoch 2", after_epoch[4], after_epoch[1], "MiB", 1.05, False),
    ]
