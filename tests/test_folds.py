"""k-fold cross-validation: `dataset.folds=K dataset.fold=I`, stratified and fixed by the seed, alike for every source;
`-m 'dataset.fold=range(0,K)'` and its mean and std per configuration."""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_folder import make_folder

from conftest import compose, csv_rows, run_cli, tiny_overrides, write_cifar
from trainer.config.store import to_settings
from trainer.data.folds import assign_folds
from trainer.tasks.data import load_data


@pytest.mark.unit
def test_folds_are_stratified_equal_in_size_and_fixed_by_the_seed():
    labels = np.repeat([0, 1, 2], [50, 31, 7])
    folds = assign_folds(labels, 5, seed=3)
    sizes = np.bincount(folds)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == len(labels)
    for label in (0, 1, 2):  # each class spread over the folds within one record of its share
        per_fold = np.bincount(folds[labels == label], minlength=5)
        assert per_fold.max() - per_fold.min() <= 1, (label, per_fold)
    assert np.array_equal(folds, assign_folds(labels, 5, seed=3))
    assert not np.array_equal(folds, assign_folds(labels, 5, seed=4))


def _images(dataset) -> Counter:
    """The multiset of a split's images (their bytes' digests) and labels."""
    return Counter(
        (hashlib.sha256(image.tobytes()).hexdigest(), int(label))
        for images, labels in dataset
        for image, label in zip(images.numpy(), labels.numpy(), strict=True)
    )


def _folded(overrides: list[str], folds: int, fold: int):
    settings = to_settings(compose([*overrides, f"dataset.folds={folds}", f"dataset.fold={fold}"]))
    return load_data(settings.dataset, batch_size=8, seed=settings.seed)


@pytest.mark.integration
@pytest.mark.parametrize("source", ["cifar", pytest.param("folder", marks=pytest.mark.slow)])
def test_the_folds_partition_train_and_val_and_leave_test_alone(tmp_path, source):
    if source == "cifar":
        overrides = [
            "dataset=cifar", f"dataset.data_dir={write_cifar(tmp_path / 'cifar')}", "dataset.val_size=16",
            "debug=smoke",
        ]  # fmt: skip
    else:
        root = make_folder(tmp_path / "photos", per_class=9)
        overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke",
                     "dataset.val_fraction=0.2", "dataset.test_fraction=0.2"]  # fmt: skip
    plain = load_data(to_settings(compose(overrides)).dataset, batch_size=8, seed=42)
    pool = _images(plain.split("train")) + _images(plain.split("val"))
    vals, folds = [], 3 if source == "cifar" else 2  # a folder's start-up decodes every file: fewer loads
    for fold in range(folds):
        data = _folded(overrides, folds, fold)
        train, val = _images(data.split("train")), _images(data.split("val"))
        assert train + val == pool, "every training record is in this fold's train or val, once"
        assert data.num_examples["val"] == sum(val.values()) and data.num_examples["test"] == plain.num_examples["test"]
        assert _images(data.split("test")) == _images(plain.split("test")), "the test split is left alone"
        counts = Counter(label for _, label in val.elements())
        assert data.class_counts["val"] == {plain.class_names[k]: v for k, v in sorted(counts.items())}
        vals.append(val)
    assert sum(vals, Counter()) == pool, "the validation folds partition the training records"
    if source == "cifar":
        assert _images(_folded(overrides, folds, 1).split("val")) == vals[1], "fixed by the seed"


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, message",
    [
        (["dataset.folds=1"], "dataset.folds must be 0 (no cross-validation) or >= 2 (one fold validates); got 1"),
        (["dataset.folds=5", "dataset.fold=5"], "dataset.fold must be in [0, dataset.folds=5); got 5"),
    ],
)
def test_a_bad_fold_is_one_line(tmp_path, extra, message):
    result = run_cli(["trainer.epochs=1", *extra], cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == f"error: {message}"


@pytest.mark.e2e
@pytest.mark.slow  # 14 s, a real multirun; the folds' splits and their one-line errors stay in the default suite
def test_a_sweep_over_the_folds_gives_each_configurations_mean_and_std(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    sweep = tmp_path / "sweep"
    arguments = ["-m", *tiny_overrides(data), "dataset.folds=3", "dataset.fold=range(0,3)", f"hydra.sweep.dir={sweep}"]
    result = run_cli(arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = csv_rows(sweep / "summary.csv")
    (row,) = csv_rows(sweep / "folds.csv")
    assert int(row["folds"]) == 3 and "dataset.fold=" not in row["configuration"]
    values = [float(job["val_accuracy"]) for job in jobs]
    assert float(row["val_accuracy_mean"]) == pytest.approx(statistics.mean(values))
    assert float(row["val_accuracy_std"]) == pytest.approx(statistics.stdev(values))
    assert "Cross-validation: mean +- std over the folds" in result.stdout
    logs = [(Path(job["run_dir"]) / "run.log").read_text() for job in jobs]
    assert all(f"Fold {fold} of 3 validates" in log for fold, log in enumerate(logs))
