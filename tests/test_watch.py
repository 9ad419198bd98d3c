"""`mode=evaluate evaluate.watch=true`: an evaluator beside training, as a user runs it next to `python run.py`."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, SUBPROCESS_ENV, csv_rows, run_cli, tiny_overrides, write_cifar
from trainer.runs.backup import METADATA
from trainer.runs.checkpoints import INFO_ENTRY
from trainer.tracking.loggers import Tracker


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


# A run folder written over time, in this process: a thread commits the epochs of a tiny trained run as the run
# would (history.csv, last.keras, then the backup), waiting for the watcher to evaluate before it goes on.


class RecordingTracker(Tracker):
    """`logger.mlflow._target_=test_watch.RecordingTracker`: joins any run and keeps what it is given in `logged`."""

    key = "mlflow"
    logged: list[tuple[str, int, dict[str, float]]] = []  # (run id, step, metrics)

    def __init__(self, **options):
        super().__init__()
        self.run_id = None

    def _join(self, run_id, ids) -> bool:
        self.run_id = run_id
        return True

    def _log(self, step, metrics) -> None:
        RecordingTracker.logged.append((self.run_id, step, metrics))


def _write_atomic(path: Path, write) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    write(temporary)
    os.replace(temporary, path)


def _write_text(path: Path, text: str) -> None:
    _write_atomic(path, lambda temporary: temporary.write_text(text))


def _checkpoint_of_epoch(source: Path, target: Path, epoch: int) -> None:
    """A copy of the checkpoint `source` whose vggtrain.json says it holds `epoch`."""

    def write(temporary: Path) -> None:
        with zipfile.ZipFile(source) as old, zipfile.ZipFile(temporary, "w") as new:
            for item in old.infolist():
                data = old.read(item)
                if item.filename == INFO_ENTRY:
                    data = json.dumps({**json.loads(data), "epoch": epoch}).encode()
                new.writestr(item, data)

    _write_atomic(target, write)


class SimulatedRun(threading.Thread):
    """Writes `run` over time from the 1-epoch run `source`: each epoch of `commits` (the last one is the last
    epoch: earlier ones go by uncommitted), `tracking.json` once the watcher evaluated `tracking_after` epochs
    (None: never), then metrics.json. Each commit waits for the watcher to evaluate the one before."""

    def __init__(self, source: Path, run: Path, evaluations: Path, commits: list[int], tracking_after: int | None):
        super().__init__(daemon=True)
        self.source, self.folder, self.evaluations = source, run, evaluations
        self.commits, self.tracking_after = commits, tracking_after
        self.error: BaseException | None = None  # raised again by `finish`
        shutil.copytree(source / ".hydra", run / ".hydra")
        (run / "checkpoints").mkdir()
        (run / "backup").mkdir()

    def _wait_for_evaluations(self, count: int) -> None:
        for _ in range(600):
            if self.evaluations.is_file() and len(csv_rows(self.evaluations)) >= count:
                return
            time.sleep(0.05)

    def _commit(self, epoch: int) -> None:
        (row,) = csv_rows(self.source / "history.csv")
        rows = io.StringIO()
        writer = csv.DictWriter(rows, list(row))
        writer.writeheader()
        writer.writerows({**row, "epoch": number} for number in range(1, epoch + 1))
        _write_text(self.folder / "history.csv", rows.getvalue())
        _checkpoint_of_epoch(
            self.source / "checkpoints" / "last.keras", self.folder / "checkpoints" / "last.keras", epoch
        )
        weights = f"weights-{epoch}.weights.h5"
        (self.folder / "backup" / weights).write_bytes(b"")  # the watcher reads the epoch, never the weights
        _write_text(self.folder / "backup" / METADATA, json.dumps({"epoch": epoch, "batch": 0, "weights": weights}))

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:
            self.error = error

    def finish(self) -> None:
        self.join(timeout=60)
        if self.error is not None:
            raise self.error

    def _write(self) -> None:
        for done, epoch in enumerate(self.commits):
            if done == self.tracking_after:
                _write_text(self.folder / "tracking.json", json.dumps({"mlflow": "the-run"}))
            self._commit(epoch)
            self._wait_for_evaluations(done + 1)
        shutil.copy(self.source / "checkpoints" / "best.keras", self.folder / "checkpoints" / "best.keras")
        shutil.copy(self.source / "metrics.json", self.folder / "metrics.json")
        shutil.rmtree(self.folder / "backup")


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory) -> Path:
    """A tiny run trained for 1 epoch: the files a simulated run copies."""
    root = tmp_path_factory.mktemp("source")
    run_dir = root / "run"
    trained = run_cli([*tiny_overrides(write_cifar(root / "cifar")), f"hydra.run.dir={run_dir}"], cwd=root)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return run_dir


def _watch_simulated_run(tmp_path, monkeypatch, source: Path, commits: list[int], tracking_after: int | None):
    """Starts the watcher on an empty run folder that a `SimulatedRun` then writes; returns (result, eval rows)."""
    monkeypatch.setattr("trainer.tasks.watch.POLL_SECONDS", 0.05)
    RecordingTracker.logged.clear()
    run_dir, watcher = tmp_path / "run", tmp_path / "watcher"
    writer = SimulatedRun(source, run_dir, watcher / "eval_history.csv", commits, tracking_after)
    writer.start()
    arguments = ["mode=evaluate", f"checkpoint={run_dir}", "evaluate.watch=true", "evaluate.watch_timeout=30"]
    tracker = ["logger=mlflow", "logger.mlflow._target_=test_watch.RecordingTracker"]
    watched = run_cli([*arguments, *tracker, f"hydra.run.dir={watcher}"], cwd=tmp_path)
    writer.finish()
    assert watched.returncode == 0, watched.stderr[-3000:]
    return watched, csv_rows(watcher / "eval_history.csv")


@pytest.mark.integration
def test_a_watcher_started_before_the_run_logs_into_its_tracker_once_tracking_json_appears(
    tmp_path, monkeypatch, one_epoch_run
):
    """A TFJob's or Vertex's evaluator starts with the chief, before tracking.json exists; here it appears only
    after the first epoch was evaluated. Every evaluation reaches the run's tracked run, the first one too."""
    watched, rows = _watch_simulated_run(tmp_path, monkeypatch, one_epoch_run, [1, 2], tracking_after=1)
    assert [(row["epoch"], row["split"]) for row in rows] == [("1", "val"), ("2", "val"), ("1", "test")]
    logged = {
        (run_id, step, key): value
        for run_id, step, metrics in RecordingTracker.logged
        for key, value in metrics.items()
    }
    expected = {
        ("the-run", int(row["epoch"]), f"eval/{row['split']}_{name}"): pytest.approx(float(row[name]))
        for row in rows
        for name in ("accuracy", "loss")
    }
    assert logged == expected


@pytest.mark.integration
def test_a_watcher_says_which_epochs_it_evaluated(tmp_path, monkeypatch, one_epoch_run):
    """Epochs 3-4 go by uncommitted (too fast for the watcher); a run without tracking.json ends it all the same."""
    watched, rows = _watch_simulated_run(tmp_path, monkeypatch, one_epoch_run, [1, 2, 5], tracking_after=None)
    assert [(row["epoch"], row["split"]) for row in rows] == [("1", "val"), ("2", "val"), ("5", "val"), ("1", "test")]
    assert RecordingTracker.logged == [], "no tracking.json: nothing to log into"
    lines = (watched.stdout + watched.stderr).splitlines()
    (last,) = [line for line in lines if "The run ended" in line]
    assert last.endswith(
        "The run ended (metrics.json) after 5 epochs: evaluated 3 epochs on val (1-2, 5) and best.keras (epoch 1) "
        "on test"
    )
    assert [line for line in lines if line.endswith("Epoch(s) 3-4 went by unevaluated: evaluating epoch 5")]
