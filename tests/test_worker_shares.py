"""Per-worker shares under strategy=multi_worker: binary records, unequal files, the same steps on every worker."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import binary_parts, compose, launch_workers, pattern_records, write_cifar
from trainer.config import to_settings
from trainer.data import pipeline, shares
from trainer.data.augmentation import Augmentation
from trainer.data.binary import BinaryLayout, records_by_size
from trainer.data.cache import Cache
from trainer.data.preprocess import Preprocess
from trainer.tasks.data import load_data

CIFAR = BinaryLayout(32, 32, 3)
PLAIN = Preprocess(image_size=32, augment=Augmentation(crop="none"))


def _indices(images: np.ndarray) -> list[int]:
    """The record index that `pattern_records` wrote into each image's G and B planes."""
    return [int(image[5, 5, 1]) + 256 * int(image[5, 5, 2]) for image in images]


def _binary_files(folder, counts: list[int]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    files, index = [], 0
    for number, count in enumerate(counts):
        path = folder / f"part_{number}.bin"
        path.write_bytes(pattern_records(np.arange(count) % 10, index))
        files.append(str(path))
        index += count
    return files


def _share_indices(share: shares.Records) -> list[int]:
    """Every record of a share, in reading order, through the binary reader the training pipeline uses."""
    source, decoder = binary_parts(share.files, CIFAR, share)
    return [index for _, _, raw in source.in_order().batch(1000) for index in _indices(decoder(raw)[0].numpy())]


@pytest.mark.unit
@pytest.mark.parametrize(
    "counts, num_workers, records_per_step, val_size, whole_files",
    [
        ([16] * 5, 2, 4, 16, False),  # CIFAR's layout: validation carved off the last train file
        ([16] * 5, 3, 4, 16, False),
        ([16] * 5, 4, 2, 0, False),  # 5 files over 4 workers: whole files would give one worker twice the records
        ([16] * 4, 2, 4, 0, True),  # whole files, equal
        ([20, 16, 16], 2, 4, 8, False),
    ],
)
def test_binary_shares_are_disjoint_and_cover_the_train_split_once(
    tmp_path, counts, num_workers, records_per_step, val_size, whole_files
):
    files = _binary_files(tmp_path, counts)
    total = sum(counts) - val_size
    plan = shares.plan(files, [records_by_size(path, CIFAR) for path in files], num_workers, records_per_step, total)
    assert plan.whole_files == whole_files
    read = [_share_indices(worker) for worker in plan.workers]
    assert [len(indices) for indices in read] == [worker.count for worker in plan.workers]
    assert sorted(index for indices in read for index in indices) == list(range(total)), "each train record once"
    assert not set().union(*read) & set(range(total, sum(counts))), "no validation record in any share"
    assert max(map(len, read)) - min(map(len, read)) <= records_per_step
    for indices in read:  # a worker's share is read in file order (the shuffle buffer then applies the seed)
        assert indices == sorted(indices)


@pytest.mark.integration
def test_binary_loader_plans_the_shares_of_the_train_split_only(tmp_path):
    """load_data with num_workers: the shares exclude dataset.val_size's records; the steps fit the smallest."""
    folder = write_cifar(tmp_path / "cifar")  # 5 x 16 train records
    overrides = ["dataset=cifar", f"dataset.data_dir={folder}", "dataset.val_size=16", "debug=smoke"]
    settings = to_settings(compose(overrides))
    data = load_data(settings.dataset, 8, 0, num_workers=2)
    assert data.num_examples["train"] == 64 and data.train_steps == 64 // 8
    single = load_data(settings.dataset, 8, 0)
    assert single.num_workers == 1 and single.train_steps == 64 // 8  # one pass over the split


@pytest.mark.integration
def test_a_resumed_input_goes_on_where_the_stream_was_on_one_pipeline_and_on_each_worker(tmp_path):
    """`train(N)` yields batch N onwards of the stream `train()` yields, images and labels, for one pipeline
    and for each worker's share (a resumed run continues its input instead of replaying it)."""
    import numpy as np
    import tensorflow as tf

    folder = write_cifar(tmp_path / "cifar")
    overrides = ["dataset=cifar", f"dataset.data_dir={folder}", "dataset.val_size=16", "debug=smoke"]
    settings = to_settings(compose(overrides))

    def batches(dataset, count):
        return [(images.numpy(), labels.numpy()) for images, labels in dataset.take(count)]

    single = load_data(settings.dataset, 8, 3)
    workers = load_data(settings.dataset, 8, 3, num_workers=2)
    pairs = [(single.train(), single.train(11))]
    for index in range(2):
        context = tf.distribute.InputContext(2, index, 1)
        pairs.append((workers.train(0, context), workers.train(11, context)))
    for whole, resumed in pairs:
        expected, got = batches(whole, 14)[11:], batches(resumed, 3)
        for (want_images, want_labels), (images, labels) in zip(expected, got, strict=True):
            np.testing.assert_array_equal(images, want_images)
            np.testing.assert_array_equal(labels, want_labels)


@pytest.mark.integration
def test_each_input_pipeline_seeds_its_own_shuffles_and_crops(tmp_path, monkeypatch):
    """Workers draw different crops at the same step: pipeline i's seed is the run's seed + i * stride."""
    import tensorflow as tf

    from trainer.data import module as data_module

    folder = write_cifar(tmp_path / "cifar")
    overrides = ["dataset=cifar", f"dataset.data_dir={folder}", "dataset.val_size=16", "debug=smoke", "seed=5"]
    settings = to_settings(compose(overrides))
    seeds = []
    real = pipeline.train_dataset
    monkeypatch.setattr(pipeline, "train_dataset", lambda *args: seeds.append(args[4]) or real(*args))  # seed
    data = load_data(settings.dataset, 8, 5, num_workers=2)
    for index in range(2):
        data.train(0, tf.distribute.InputContext(2, index, 1))
    assert seeds[-2:] == [5, 5 + data_module.WORKER_SEED_STRIDE]  # after the one-pipeline train split's


@pytest.mark.unit
@pytest.mark.parametrize("cache", [None, Cache("memory")], ids=["read", "cached"])
@pytest.mark.parametrize(
    "counts, records_per_step, whole_files, steps",
    [
        ([100, 100, 50], 5, False, 25),  # whole files: 150 against 100 records; ranges: 125 each
        ([50, 48, 50, 50], 5, True, 19),  # whole files within one step of each other: 100 and 98 records
        ([7, 5], 1, False, 6),  # 7 against 5: beyond one step apart
        ([7, 5], 2, True, 2),  # within one step: whole files, 2 steps from the smaller file
    ],
)
def test_unequal_files_every_worker_runs_the_same_steps_and_reads_each_record_at_most_once_per_epoch(
    tmp_path, counts, records_per_step, whole_files, steps, cache
):
    files = _binary_files(tmp_path, counts)
    plan = shares.plan(files, counts, 2, records_per_step)
    assert plan.whole_files == whole_files and plan.steps_per_epoch == steps
    assert steps == min(worker.count for worker in plan.workers) // records_per_step
    for worker in plan.workers:
        assert worker.per_epoch == steps * records_per_step
        share = set(_share_indices(worker))
        source, decoder = binary_parts(worker.files, CIFAR, worker)
        dataset = pipeline.train_dataset(source, decoder, PLAIN, records_per_step, 1, 1000, cache)
        batches = [images.numpy() for images, _ in dataset.take(3 * steps)]
        for epoch in range(3):
            read = [index for images in batches[epoch * steps : (epoch + 1) * steps] for index in _indices(images)]
            assert len(read) == len(set(read)) == worker.per_epoch, "each record at most once per epoch"
            assert set(read) <= share


@pytest.mark.unit
def test_the_share_log_says_whole_files_or_record_ranges_and_the_steps(tmp_path):
    files = _binary_files(tmp_path, [100, 100, 50])
    plan = shares.plan(files, [100, 100, 50], 2, 5)
    text = plan.describe(0)
    assert text.startswith(f"records 0-99 of {files[0]}, 0-24 of {files[1]} (125 records, 125 per epoch)")
    assert "every worker's share holds 25 steps per epoch" in text
    whole = shares.plan(files[:2], [100, 100], 2, 5)
    assert whole.describe(1).startswith("1 of 2 whole file(s) (100 records, 100 per epoch)")


@pytest.mark.unit
def test_a_batch_larger_than_the_smallest_share_or_fewer_records_than_workers_is_a_config_error(tmp_path):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="the 10 training records cannot feed 2 workers: each needs 8 records per"):
        shares.plan(["a", "b"], [5, 5], 2, 8)
    with pytest.raises(ConfigError, match="the 3 training records cannot feed 4 workers: .* holds 0; use fewer work"):
        shares.plan(["a"], [3], 4, 1)  # fewer records than workers


@pytest.mark.unit
def test_mirrored_on_one_machine_keeps_one_pipeline_for_every_replica():
    import tensorflow as tf

    from trainer.distribute import strategies, topology

    strategy = strategies.mirrored(["/cpu:0"])
    dataset = tf.data.Dataset.range(4)
    assert topology.num_input_pipelines(strategy) == 1
    assert strategies.distribute_training_data(strategy, dataset, lambda context: tf.data.Dataset.range(1)) is dataset


def _share_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "Input pipeline" in line]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_loopback_workers_each_read_about_half_of_the_binary_records(tmp_path):
    """Two multi_worker processes on 127.0.0.1 over CIFAR-format files: each reads its own half (a record range,
    the validation records excluded), both run the same steps and finish with the same weights."""
    folder = write_cifar(tmp_path / "cifar")  # 80 train records, the last 16 for validation
    overrides = ["dataset=cifar", f"dataset.data_dir={folder}", "dataset.val_size=16", "debug=smoke"]
    overrides += ["trainer.batch_size=8", "trainer.steps_per_epoch=null", "strategy=multi_worker"]
    overrides += ["model.batch_norm=false"]  # Keras's batch norm statistics are each worker's own
    processes = launch_workers(
        overrides, tmp_path, per_worker=lambda index: ([f"hydra.run.dir={tmp_path / f'run{index}'}"], {})
    )
    outputs = [process.communicate(timeout=900)[0] for process in processes]
    for index, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, output[-3000:]
        lines = _share_lines(output)
        assert len(lines) == 1 and f"Input pipeline {index + 1} of 2 reads records" in lines[0], output[-3000:]
        read = int(re.search(r"\((\d+) records, (\d+) per epoch", lines[0]).group(2))
        assert read == 32, lines[0]  # half of the 64 train records, per epoch
        assert "every worker's share holds 8 steps per epoch" in lines[0]
        own = {0: (1, 2), 1: (3, 4)}[index]  # records 0-31 and 32-63; data_batch_5.bin holds the validation records
        for number in range(1, 6):
            assert (f"0-15 of {folder}/data_batch_{number}.bin" in lines[0]) == (number in own), lines[0]
    weights = [line for output in outputs for line in output.splitlines() if "Final weights sha256" in line]
    assert len(weights) == 2 and weights[0].split("sha256")[-1] == weights[1].split("sha256")[-1]
