"""Shared fixtures: the real config composed with Hydra, and tiny datasets made on the fly."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CIFAR_TRAIN = [f"data_batch_{index}.bin" for index in range(1, 6)]


def compose(overrides: list[str], output_dir: Path | str = "unused"):
    """The composed config, as `python run.py OVERRIDES` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=[*overrides, f"output_dir={output_dir}"])


def pattern_records(labels: np.ndarray, first_index: int = 0, size: int = 32, channels: int = 3) -> bytes:
    """CIFAR-layout records whose pixels carry their own label and index.

    Channel-first planes: R is `label * 20` everywhere, G is `index % 256`,
    B is `index // 256`; the top-left pixel of R is 255 so an HWC/CHW mix-up shows.
    """
    count = len(labels)
    planes = np.zeros((count, channels, size, size), dtype=np.uint8)
    index = np.arange(first_index, first_index + count)
    planes[:, 0] = (labels * 20)[:, None, None]
    if channels == 3:
        planes[:, 1] = (index % 256)[:, None, None]
        planes[:, 2] = (index // 256)[:, None, None]
    return np.concatenate([labels[:, None].astype(np.uint8), planes.reshape(count, -1)], axis=1).tobytes()


def write_cifar(folder: Path, records_per_file: int = 16, num_test: int = 16, seed: int = 0) -> Path:
    """Writes tiny CIFAR-10 binary files (pattern images, labels 0..9) into `folder`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    index = 0
    for name in CIFAR_TRAIN:
        labels = rng.integers(0, 10, records_per_file)
        (folder / name).write_bytes(pattern_records(labels, index))
        index += records_per_file
    (folder / "test_batch.bin").write_bytes(pattern_records(rng.integers(0, 10, num_test), index))
    return folder


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    return write_cifar(tmp_path / "cifar")


def cifar_overrides(data_dir: Path) -> list[str]:
    """Overrides that make `dataset=cifar` fit the tiny files of `write_cifar`."""
    return [
        "dataset=cifar",
        f"dataset.data_dir={data_dir}",
        "dataset.val_size=16",
        "debug=smoke",
        "trainer.batch_size=8",
        "trainer.steps_per_epoch=2",
    ]


def tfrecord_parts(files, spec, labeled: bool = True, num_classes: int | None = 2, shares=None):
    """(Source, decoder) of TFRecord `files` (or of one worker's `shares`, a `Records`) as `dataset=cats_dogs`
    builds them, for the one pipeline (`trainer.data.pipeline`)."""
    from trainer.data import tfrecords
    from trainer.data.decoders import TFRecordDecoder
    from trainer.data.shares import Records
    from trainer.data.sources import Source, TFRecordReader

    paths = [str(file) for file in files]
    if shares is None:
        shares = Records.whole_files(paths, sum(tfrecords.count_records(path, spec) for path in paths))
    reader = TFRecordReader(tfrecords.compression_of(paths, spec.compression))
    return Source(shares, reader), TFRecordDecoder(spec, num_classes if labeled else None, labeled)


def binary_parts(files, layout, records=None, num_classes: int | None = None):
    """(Source, decoder) of fixed-length record `files` (whole, or the given `Records`), as `dataset=cifar` has."""
    from trainer.data import binary
    from trainer.data.decoders import BinaryDecoder
    from trainer.data.shares import Records
    from trainer.data.sources import FixedLengthReader, Source

    paths = [str(file) for file in files]
    if records is None:
        records = Records.whole_files(paths, sum(binary.count_records(path, layout) for path in paths))
    return Source(records, FixedLengthReader(layout.record_bytes)), BinaryDecoder(layout, num_classes)


def run_py(args: list[str], cwd: Path = ROOT, timeout: int = 600):
    """`python run.py ARGS` in a subprocess, as a user types it; returns the CompletedProcess (text output)."""
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def check_run_metrics(run_dir: Path, mode: str = "max") -> dict:
    """Cross-checks a finished run's files, so that a run writing wrong figures fails where a bare
    `0 <= accuracy <= 1` would pass: the objective is the best `objective.metric` of history.csv and
    the val figures are that epoch's; test accuracy is the confusion matrix's diagonal over its total;
    the losses are finite. Returns metrics.json."""
    import csv
    import json
    import math

    metrics = json.loads((run_dir / "metrics.json").read_text())
    with open(run_dir / "history.csv", newline="") as handle:
        history = list(csv.DictReader(handle))
    values = [float(row[metrics["objective_metric"]]) for row in history]
    best = (max if mode == "max" else min)(values)
    assert metrics["objective"] == pytest.approx(best, abs=1e-6)
    assert len(history) == metrics["epochs_completed"]
    best_row = history[metrics["best_epoch"] - 1]
    assert float(best_row[metrics["objective_metric"]]) == pytest.approx(best, abs=1e-6)
    assert metrics["val_accuracy"] == pytest.approx(float(best_row["val_accuracy"]), abs=1e-6)
    with open(run_dir / "confusion_matrix_test.csv", newline="") as handle:
        counts = np.array([[int(cell) for cell in row[1:]] for row in list(csv.reader(handle))[1:]])
    assert counts.sum() == metrics["num_examples"]["test"]
    assert metrics["test_accuracy"] == pytest.approx(np.trace(counts) / counts.sum(), abs=1e-6)
    assert math.isfinite(metrics["test_loss"]) and math.isfinite(metrics["val_loss"])
    return metrics
