"""Training end to end: in-process through `train(cfg)`, and as `python run.py` in a subprocess."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import keras

from conftest import ROOT, cifar_overrides, compose
from trainer.config import to_settings
from trainer.tasks.train import train

METRIC_KEYS = {"val_accuracy", "val_loss", "test_accuracy", "test_loss", "epochs_completed"}


def _run(args, cwd=ROOT, timeout=300):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_train_returns_the_best_objective_and_writes_metrics(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    settings = to_settings(compose([*cifar_overrides(cifar_dir), "trainer.epochs=2"], run_dir))
    objective = train(settings)
    assert type(objective) is float
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics)
    with open(run_dir / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["epoch"]) for row in rows] == [1, 2]
    assert objective == max(float(row["val_accuracy"]) for row in rows) == metrics["objective"]
    assert metrics["epochs_completed"] == 2
    # The test figures are the best checkpoint's, evaluated again here.
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    assert model.get_layer("vgg19").get_layer("block1_conv1").filters == 8


def test_run_py_writes_every_output(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    result = _run([*cifar_overrides(cifar_dir), f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in (
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "run.log",
        "history.csv",
        "metrics.json",
        "checkpoints/best.keras",
        "checkpoints/last.keras",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics) and 0.0 <= metrics["test_accuracy"] <= 1.0
    assert "Test accuracy" in (run_dir / "run.log").read_text()


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    result = _run(["dataset=cifar", f"dataset.data_dir={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: dataset files data_batch_1.bin") and "nowhere" in last
    assert "Traceback" not in result.stderr


def test_out_of_range_value_fails_at_startup(tmp_path):
    result = _run(["model.dropout=1.0", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: model.dropout must be in [0, 1); got 1.0"
