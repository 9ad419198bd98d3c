"""`mode=evaluate evaluate.watch=true`: an evaluator beside training, as a user runs it next to `python run.py`."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SUBPROCESS_ENV, csv_rows, run_cli, tiny_overrides, write_cifar


@pytest.mark.e2e
@pytest.mark.slow  # 19 s; the slow TFJob test runs its evaluator task too
def test_a_watcher_beside_training_evaluates_each_committed_epoch_as_mode_evaluate_does(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "run.py"), *tiny_overrides(data), f"hydra.run.dir={run_dir}"]
    training = subprocess.Popen(
        [*command, "trainer.epochs=4", "trainer.steps_per_epoch=30"],
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(600):  # the run's saved config is there before TensorFlow is imported
            if (run_dir / ".hydra" / "config.yaml").is_file():
                break
            time.sleep(0.1)
        watcher = tmp_path / "watcher"
        arguments = ["mode=evaluate", f"checkpoint={run_dir}", "evaluate.watch=true", "evaluate.watch_timeout=300"]
        watched = run_cli([*arguments, f"hydra.run.dir={watcher}"], cwd=tmp_path)
    finally:
        output = training.communicate(timeout=300)[0]
    assert training.returncode == 0, output[-3000:]
    assert watched.returncode == 0, watched.stderr[-3000:]
    assert not (run_dir / "eval_history.csv").exists(), "the watcher only reads the run folder"

    rows = csv_rows(watcher / "eval_history.csv")
    val = [row for row in rows if row["split"] == "val"]
    epochs = [int(row["epoch"]) for row in val]
    assert epochs == sorted(set(epochs)) and epochs[-1] == 4, "each epoch at most once, the last one always"
    assert [row["split"] for row in rows][-1] == "test"

    # The last epoch's figures are mode=evaluate's of last.keras; the test row is the run's own test figure.
    last = f"checkpoint={run_dir}/checkpoints/last.keras"
    again = run_cli(["mode=evaluate", last, "evaluate.split=val", f"dataset.data_dir={data}"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    alone = json.loads(next((tmp_path / "outputs").glob("*/*/metrics.json")).read_text())
    assert float(val[-1]["accuracy"]) == pytest.approx(alone["accuracy"], abs=1e-6)
    assert float(val[-1]["loss"]) == pytest.approx(alone["loss"], rel=1e-5)
    final = json.loads((run_dir / "metrics.json").read_text())
    assert float(rows[-1]["accuracy"]) == pytest.approx(final["test_accuracy"], abs=1e-6)
    assert (watcher / "tensorboard" / "eval").is_dir()


@pytest.mark.integration
def test_a_watcher_needs_a_run_folder(tmp_path):
    result = run_cli(["mode=evaluate", f"checkpoint={tmp_path}", "evaluate.watch=true"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.integration
def test_training_without_validation_leaves_it_to_an_evaluator(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(data), f"hydra.run.dir={run_dir}", "trainer.epochs=2", "trainer.validate=false"]
    refused = run_cli(overrides, cwd=tmp_path)
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: trainer.validate=false leaves no val_accuracy for objective.metric: "
            "choose objective.metric=accuracy"
        )
    )
    result = run_cli([*overrides, "objective.metric=accuracy"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    header = list(csv_rows(run_dir / "history.csv")[0])
    assert "accuracy" in header and not [name for name in header if name.startswith("val_")]
    assert "test_accuracy" in json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("tracked", [False, pytest.param(True, marks=pytest.mark.slow)])  # MLflow: +20-40 s
def test_watching_a_run_that_has_ended_evaluates_what_is_there_and_stops(tmp_path, tracked):
    """... and logs its figures into the run's MLflow run, found through tracking.json from another folder."""
    data = write_cifar(tmp_path / "cifar")
    run_dir, watcher = tmp_path / "run", tmp_path / "watcher"
    logger = ["logger=mlflow", f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"] if tracked else []
    trained = run_cli([*tiny_overrides(data), *logger, f"hydra.run.dir={run_dir}", "trainer.epochs=2"], cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    arguments = ["mode=evaluate", f"checkpoint={run_dir}", "evaluate.watch=true", f"hydra.run.dir={watcher}"]
    (tmp_path / "elsewhere").mkdir()  # launched from another folder: the default store would be another one
    watched = run_cli([*arguments, *(["logger.tracking_uri=null"] if tracked else [])], cwd=tmp_path / "elsewhere")
    assert watched.returncode == 0, watched.stderr[-3000:]
    evaluations = csv_rows(watcher / "eval_history.csv")
    rows = [(row["epoch"], row["split"]) for row in evaluations]
    best = json.loads((run_dir / "metrics.json").read_text())["best_epoch"]
    assert rows == [("2", "val"), (str(best), "test")]
    if not tracked:
        return
    mlflow = pytest.importorskip("mlflow")
    ids = json.loads((run_dir / "tracking.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=ids["mlflow_tracking_uri"])
    for row in evaluations:
        (logged,) = client.get_metric_history(ids["mlflow"], f"eval/{row['split']}_accuracy")
        assert (logged.step, logged.value) == (int(row["epoch"]), pytest.approx(float(row["accuracy"])))
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED", "the watcher leaves the run as training left it"
