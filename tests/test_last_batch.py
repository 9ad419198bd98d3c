"""Every training image once an epoch: the last batch of an epoch is kept, partial, as Keras's `fit` keeps it; where
the replicas need equal parts of it, the few images left out are said in one line."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from conftest import compose, tfrecord_parts, write_cifar
from trainer.config import to_settings
from trainer.data import pipeline, record_writer, tfrecords
from trainer.data.preprocess import Preprocess
from trainer.data.shares import Records

SPEC = tfrecords.RecordSpec.for_format("raw", 4)


def _indexed_records(folder, count: int) -> list[str]:
    """`count` 4x4 records in one TFRecord file, each holding its index in its first pixel."""
    path = folder / "part-0.tfrecords"
    with record_writer.RecordFile(str(path)) as handle:
        for index in range(count):
            pixels = np.zeros((4, 4, 3), np.uint8)
            pixels[0, 0, 0] = index
            handle.write(tfrecords.make_example(SPEC, pixels.tobytes(), index % 2, None, 4, 4))
    return [str(path)]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("count", "batch", "replicas", "expected"),
    [
        (241, 128, 1, (2, 0)),  # the 241 photos: 113 were never seen in an epoch
        (241, 32, 1, (8, 0)),
        (256, 128, 1, (2, 0)),
        (21, 8, 2, (3, 1)),  # a last batch of 5 for 2 replicas: 4 kept, 2 each
        (17, 8, 2, (2, 1)),  # a last batch of 1 for 2 replicas: left out
    ],
)
def test_one_pass_is_its_whole_batches_then_its_partial_one(count, batch, replicas, expected):
    assert pipeline.pass_batches(count, batch, replicas) == expected


@pytest.mark.unit
@pytest.mark.parametrize(("replicas", "sizes"), [(1, [8, 8, 5]), (2, [8, 8, 4])])
def test_each_epoch_of_the_training_stream_reads_every_record_once(tmp_path, replicas, sizes):
    """21 records, batches of 8: an epoch of 3 steps holds each record once (2 steps held 16 of them); for 2
    replicas the last batch is cut to 4, one record left out, a different one each epoch."""
    files = _indexed_records(tmp_path, 21)
    source, decoder = tfrecord_parts(files, SPEC, shares=Records.whole_files(files, 21))
    dataset = pipeline.train_dataset(source, decoder, Preprocess(4), 8, 3, 8, replicas=replicas)
    steps = pipeline.pass_batches(21, 8, replicas)[0]
    epochs, left_out = [[], [], [], []], []
    for step, (images, _) in enumerate(dataset.take(4 * steps)):
        epochs[step // steps].append([int(image[0, 0, 0]) for image in images.numpy()])
    for batches in epochs:
        assert [len(batch) for batch in batches] == sizes
        seen = collections.Counter(index for batch in batches for index in batch)
        assert max(seen.values()) == 1 and len(seen) == 21 - (replicas - 1)
        left_out.append(frozenset(range(21)) - set(seen))
    assert replicas == 1 or len(set(left_out)) > 1, "the record left out is drawn anew each epoch"


def _plan(tmp_path, *overrides):
    from trainer.tasks import train
    from trainer.tasks.runtime import setup_strategy

    data = write_cifar(tmp_path / "cifar", records_per_file=15)  # 75 records, 16 of them validate: 59 train
    settings = to_settings(
        compose(
            [
                "dataset=cifar",
                f"dataset.data_dir={data}",
                "dataset.val_size=16",
                "debug=smoke",
                "trainer.steps_per_epoch=null",
                *overrides,
            ],
            tmp_path / "run",
        )
    )
    return train.plan_run(settings, setup_strategy(settings))


@pytest.mark.integration
def test_a_small_training_split_is_seen_whole_every_epoch(tmp_path, caplog):
    caplog.set_level("INFO", logger="trainer.tasks")
    plan = _plan(tmp_path, "trainer.batch_size=32")
    assert plan.steps_per_epoch == 2, "59 images in batches of 32: 32 + 27 (one step saw 32 of them)"
    assert "Global batch 32 = 1 replica(s) x 32, 2 steps per epoch (the last of 27 images)" in caplog.text
    assert "leaves out" not in caplog.text
    images = [batch[0].shape[0] for batch in plan.data.train().take(4)]
    assert images == [32, 27, 32, 27]


@pytest.mark.integration
def test_replicas_that_need_equal_parts_of_the_last_batch_leave_out_the_rest_in_one_line(tmp_path, caplog):
    caplog.set_level("INFO", logger="trainer.tasks")
    plan = _plan(tmp_path, "trainer.batch_size=8", "strategy=mirrored", "strategy.cpu_devices=2")
    assert plan.steps_per_epoch == 8, "59 images: 7 batches of 8, then 2 of the last 3 (1 each)"
    assert "Each epoch leaves out 1 of the 59 training images (a new draw each epoch): a batch is split among 2" in (
        caplog.text
    )
    assert [batch[0].shape[0] for batch in plan.data.train().take(8)][-1] == 2
