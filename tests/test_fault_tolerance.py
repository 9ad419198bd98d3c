"""A kill, a preemption or a NaN costs at most the work since the last save, never the run.

The killed runs are real processes; each resume is `python run.py resume=RUN`, run in this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import ROOT, SUBPROCESS_ENV, cifar_overrides, compose, csv_rows, run_cli, tiny_overrides, write_cifar
from trainer.errors import UserError
from trainer.runs.atomic import write_atomic
from trainer.tasks import run_task

EPOCHS = 6  # of 30 steps each: long enough for a signal to land mid-run


def _command(data: Path, run_dir: Path, *extra: str) -> list[str]:
    """`python run.py` training the three-layer test model (the point is the kill, not the model)."""
    return [sys.executable, str(ROOT / "run.py"), *tiny_overrides(data), f"hydra.run.dir={run_dir}", *extra]


def _epochs(history: Path) -> list[int]:
    if not history.is_file():
        return []
    return [int(row["epoch"]) for row in csv_rows(history)]


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=SUBPROCESS_ENV
    )


def _wait_for_epochs(process: subprocess.Popen, history: Path, count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(_epochs(history)) < count:
        assert process.poll() is None, "training ended before it could be interrupted"
        assert time.monotonic() < deadline, "training too slow"
        time.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.slow  # test_run_folder_kills's kill-and-resume to the weights of a run never killed covers it (15 s)
def test_sigkill_then_resume_has_every_epoch_exactly_once(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    run_dir = tmp_path / "run"
    slow = [f"trainer.epochs={EPOCHS}", "trainer.steps_per_epoch=30"]
    process = _start(_command(data, run_dir, *slow), tmp_path)
    _wait_for_epochs(process, run_dir / "history.csv", 2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run_dir / "metrics.json").exists()
    assert (run_dir / "backup").is_dir()
    resumed = run_cli([*tiny_overrides(data), *slow, f"resume={run_dir}"], cwd=tmp_path)  # the same command
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming {run_dir} after epoch" in resumed.stdout + resumed.stderr
    assert _epochs(run_dir / "history.csv") == list(range(1, EPOCHS + 1))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs_completed"] == EPOCHS
    assert not (run_dir / "backup").exists(), "a finished run removes its backup"


@pytest.mark.e2e
@pytest.mark.slow  # 16 s each; test_run_folder_kills.py's default SIGTERM test (within epoch 2) checks the same
# exit 0, backup, "To continue" line and `preempted` end line in this process, and its resume exactness
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["sigterm", "slurm-usr1"])
def test_sigterm_saves_a_backup_and_exits_cleanly(tmp_path, signum):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    run_dir = tmp_path / "run"
    process = _start(_command(data, run_dir, f"trainer.epochs={EPOCHS}", "trainer.steps_per_epoch=30"), tmp_path)
    _wait_for_epochs(process, run_dir / "history.csv", 1)
    process.send_signal(signum)  # SIGUSR1: Slurm's warning (sbatch --signal=USR1@120) before --time ends
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-3000:]
    assert f"To continue, run: python run.py resume={run_dir}" in output
    end = json.loads((run_dir / "invocations.jsonl").read_text().splitlines()[-1])
    assert end["outcome"] == "preempted" and end["stopped"] == signal.Signals(signum).name
    metadata = json.loads((run_dir / "backup" / "training_metadata.json").read_text())
    done = metadata["epoch"]
    assert 1 <= done < EPOCHS and _epochs(run_dir / "history.csv") == list(range(1, done + 1))
    resumed = run_cli([f"resume={run_dir}"], cwd=tmp_path)  # the run's own config: nothing but resume= is needed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _epochs(run_dir / "history.csv") == list(range(1, EPOCHS + 1))


@pytest.mark.integration
def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    run_dir = tmp_path / "run"
    # The learning rate jumps by 1e12 after epoch 1: training diverges after that.
    overrides = [
        *cifar_overrides(data),
        "trainer.epochs=5",
        "optimizer.schedule.name=step",
        "optimizer.schedule.boundaries=[1]",
        "optimizer.schedule.factor=1e12",
        "model.batch_norm=false",
    ]
    with pytest.raises(UserError, match=r"loss became (nan|inf) at epoch (\d+), step \d+") as error:
        run_task(compose(overrides, run_dir))
    failed_epoch = int(str(error.value).split("at epoch ")[1].split(",")[0])
    assert failed_epoch >= 2 and str(run_dir / "checkpoints") in str(error.value)
    weights = keras.saving.load_model(run_dir / "checkpoints" / "last.keras").get_weights()
    assert all(np.isfinite(weight).all() for weight in weights), "last.keras holds the last good epoch"
    assert _epochs(run_dir / "history.csv") == list(range(1, failed_epoch)), "the diverged epoch is not recorded"


@pytest.mark.unit
def test_a_kill_at_the_rename_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.keras"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    write_atomic(path, model.save)
    before = path.read_bytes()
    model.layers[0].kernel.assign(np.ones((4, 2)))

    def killed(source, target):
        raise KeyboardInterrupt("killed between writing and renaming")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, model.save)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert not np.all(keras.saving.load_model(path).get_weights()[0] == 1.0)
    assert [p.name for p in tmp_path.iterdir()] == ["last.keras"], "no temporary file is left behind"


@pytest.mark.integration
def test_deterministic_runs_give_identical_weights(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    fingerprints = []
    for name in ("a", "b"):
        overrides = [*tiny_overrides(data), "trainer.deterministic=true", "trainer.epochs=2"]
        run_task(compose(overrides, tmp_path / name))
        fingerprints.append(json.loads((tmp_path / name / "metrics.json").read_text())["weights_sha256"])
    assert fingerprints[0] == fingerprints[1]


@pytest.mark.integration
def test_resume_of_a_finished_run_is_refused(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    run_task(compose(tiny_overrides(data), tmp_path / "run"))
    with pytest.raises(UserError, match="the run finished"):
        run_task(compose([*tiny_overrides(data), f"resume={tmp_path / 'run'}"], tmp_path / "again"))
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    refused = run_cli([f"resume={tmp_path / 'run'}"], cwd=tmp_path)  # as typed: refused before Hydra logs into it
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: resume={tmp_path / 'run'}: the run finished (it has metrics.json); to train on from its weights, "
        f"start a new run with model.init_from={tmp_path / 'run'} (its own folder, config and schedule, "
        "e.g. trainer.epochs=20)"
    ]
    after = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    assert after == before, "a refused command writes nothing into the run (run.log included)"


@pytest.mark.unit
def test_a_time_budget_reads_as_seconds_and_stops_before_an_epoch_that_would_not_fit():
    from trainer.errors import ConfigError
    from trainer.fields import duration_seconds
    from trainer.training.callbacks import TimeBudget

    assert [duration_seconds(text, "k") for text in ("2h30m", "90m", "45s", "1d", 3600, "1.5h")] == [
        9000,
        5400,
        45,
        86400,
        3600,
        5400,
    ]
    for bad in ("soon", "2x", "-5", "0"):
        with pytest.raises(ConfigError, match="trainer.time_budget"):
            duration_seconds(bad, "trainer.time_budget")

    now = [0.0]
    budget = TimeBudget(100, started=0.0, steps_per_epoch=10, clock=lambda: now[0])
    budget.epoch_done(20)  # margin: max(5, 2) = 5
    now[0] = 74.0
    assert budget.next_epoch_fits()  # 26 s left >= 20 + 5
    now[0] = 76.0
    assert not budget.next_epoch_fits() and not budget.out_of_time_in_epoch()
    now[0] = 96.0
    assert budget.out_of_time_in_epoch()

    short = TimeBudget(30, started=0.0, steps_per_epoch=100, clock=lambda: now[0])
    with pytest.raises(ConfigError, match=r"time_budget=30 s is shorter than one epoch \(about 100 s, measured"):
        for step in range(5):
            now[0] = step * 1.0  # 1 s per step after the first
            short.check_step()


@pytest.mark.integration
def test_a_run_out_of_its_time_budget_stops_saved_and_resumes(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(data), f"hydra.run.dir={run_dir}", "trainer.epochs=500", "trainer.steps_per_epoch=30"]
    result = run_cli([*overrides, "trainer.time_budget=8s"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Stopped by the time budget (trainer.time_budget=8s)" in result.stdout + result.stderr
    end = json.loads((run_dir / "invocations.jsonl").read_text().splitlines()[-1])
    assert end["stopped"] == "time budget" and not (run_dir / "metrics.json").exists()
    done = json.loads((run_dir / "backup" / "training_metadata.json").read_text())["epoch"]
    assert _epochs(run_dir / "history.csv") == list(range(1, done + 1)) and done < 500

    # The budget may change on resume (it changes when the run stops, not what it trains). 16 s leaves 11 s for
    # the resume's start-up and one epoch beside the 5 s save margin: 8 s left 3 s, which a loaded CI machine's
    # start-up alone took (it stopped at its first step, having trained nothing).
    resumed = run_cli([f"resume={run_dir}", "trainer.time_budget=16s"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((run_dir / "backup" / "training_metadata.json").read_text())["epoch"]
    assert again > done and _epochs(run_dir / "history.csv") == list(range(1, again + 1))
