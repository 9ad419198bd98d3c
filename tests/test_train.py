"""Training end to end: in process through `train(cfg)` and `run.py`'s `cli`, and as `python run.py` in a real
process once (the canonical run: every output file, the console without TensorFlow's noise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import keras
import pytest

from conftest import ROOT, check_run_metrics, cifar_overrides, compose, csv_rows, run_cli, run_py, tiny_overrides
from trainer.config import to_settings
from trainer.quiet import NOISE
from trainer.tasks.train import train

METRIC_KEYS = {"val_accuracy", "val_loss", "test_accuracy", "test_loss", "epochs_completed"}


def _run(args, cwd=ROOT, timeout=300):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.integration
def test_train_returns_the_best_objective_and_writes_metrics(tmp_path, cifar_dir):
    """The three-layer test model (the objective is the model's business, not VGG19's: the shared trained run's
    best.keras is checked below)."""
    run_dir = tmp_path / "run"
    settings = to_settings(compose([*tiny_overrides(cifar_dir), "trainer.epochs=2"], run_dir))
    objective = train(settings)
    assert type(objective) is float
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics)
    rows = csv_rows(run_dir / "history.csv")
    assert [int(row["epoch"]) for row in rows] == [1, 2]
    assert objective == max(float(row["val_accuracy"]) for row in rows) == metrics["objective"]
    assert metrics["epochs_completed"] == 2


@pytest.mark.integration
def test_a_smoke_run_saves_vgg19_at_the_smoke_width(trained_run):
    """`debug=smoke` (the tests' VGG19 runs) trains VGG19 at width 0.125: block1 has 8 filters, not 64."""
    _, run_dir = trained_run
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    assert model.get_layer("vgg19").get_layer("block1_conv1").filters == 8


TF_NOISE = ("cuInit", "absl::InitializeLog", "cudart_stub", "oneDNN", "cpu_feature_guard", "then broadcast")


@pytest.mark.e2e
def test_run_py_writes_every_output(tmp_path, cifar_dir):
    """The three-layer test model (tests/tiny_model.py, on the process's PYTHONPATH) with the evaluation report:
    the outputs are the run's, whatever the model."""
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(cifar_dir), "evaluate.report=true", "trainer.epochs=2", f"hydra.run.dir={run_dir}"]
    result = run_py(overrides, cwd=tmp_path, timeout=300)
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
    metrics = check_run_metrics(run_dir)
    assert METRIC_KEYS <= set(metrics)
    console, log = result.stdout + result.stderr, (run_dir / "run.log").read_text()
    # TensorFlow's start-up noise stays out of the console and the log.
    for text in (console, log):
        assert not [noise for noise in TF_NOISE if noise in text], text[:3000]
    # One line per epoch, ours: no Keras progress line beside it.
    assert re.findall(r"\] - (Epoch \d+/\d+): ", log) == ["Epoch 1/2", "Epoch 2/2"]
    assert re.findall(r"\] - (Epoch \d+/\d+): ", console) == ["Epoch 1/2", "Epoch 2/2"]
    assert "step - " not in console and "/step" not in console
    # The config tree shows the sections training reads, not predict/inspect/export.
    tree = (run_dir / "config_tree.txt").read_text()
    assert "optimizer" in tree and not {"predict", "inspect", "export", "finetune"} & set(tree.split())
    # One summary at the end: the folder, the best epoch, val and test accuracy, the files to open.
    summary = log[log.index("Run finished: ") :]
    assert str(run_dir.resolve()) in summary.splitlines()[0]
    assert f"best epoch {metrics['best_epoch']} of 2 by val_accuracy" in summary
    assert f"val_accuracy {metrics['val_accuracy']:.4f}, test_accuracy {metrics['test_accuracy']:.4f}" in summary
    assert "open: curves.png, confusion_matrix_test.png, metrics.json, report/report.html, history.csv" in summary


@pytest.mark.e2e
@pytest.mark.slow  # a subprocess training run (~11 s alone): the default suite is at its 10 minutes
def test_tf_logs_brings_tensorflow_s_own_lines_back(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    result = _run(
        [*cifar_overrides(cifar_dir), "trainer.tf_logs=true", "mode=inspect", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(NOISE.match(line) for line in result.stderr.splitlines()), result.stderr[-3000:]


@pytest.mark.integration
def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    result = run_cli(["dataset=cifar", f"dataset.data_dir={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: dataset files data_batch_1.bin") and "nowhere" in last
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_out_of_range_value_fails_at_startup(tmp_path):
    result = run_cli(["model.dropout=1.0", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: model.dropout must be in [0, 1); got 1.0"
