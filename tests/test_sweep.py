"""Hydra multirun sweeps: summary.csv rows as jobs end, failures recorded (the Optuna search: test_search.py).

Each sweep is `python run.py -m ...` run in this process (`conftest.run_cli`): the basic launcher runs its jobs in the
calling process, the joblib launcher in its own worker processes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from conftest import (
    CliResult,
    cifar_overrides,
    csv_rows,
    run_cli,
    run_patched,
    signal_in_first_step,
    tiny_overrides,
    write_cifar,
)


def _sweep(tmp_path: Path, *overrides: str, model: str = "vgg19") -> tuple[CliResult, list[dict[str, str]]]:
    """`python run.py -m` over tiny CIFAR-format files with VGG19 (or the three-layer test model), and its summary."""
    data = write_cifar(tmp_path / "cifar")
    small = tiny_overrides(data) if model == "tiny" else cifar_overrides(data)
    result = run_cli(["-m", *small, f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides], cwd=tmp_path)
    summary = tmp_path / "sweep" / "summary.csv"
    assert summary.is_file(), result.stdout[-2000:] + result.stderr[-3000:]
    return result, sorted(csv_rows(summary), key=lambda row: int(row["job"]))


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])  # joblib: 23 s
def test_grid_sweep_summarises_every_job(tmp_path, launcher):
    extra = [] if launcher == "basic" else ["launcher=joblib"]
    result, rows = _sweep(tmp_path, "optimizer.lr=0.1,0.01", *extra, model="tiny")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["status"] for row in rows] == ["complete", "complete"]
    for row in rows:
        metrics = json.loads((Path(row["run_dir"]) / "metrics.json").read_text())
        assert float(row["objective"]) == pytest.approx(metrics["objective"], rel=1e-5)
        assert float(row["test_accuracy"]) == pytest.approx(metrics["test_accuracy"])
    assert "optimizer.lr=0.1" in rows[0]["overrides"] and "optimizer.lr=0.01" in rows[1]["overrides"]
    assert "Sweep summary: 2 jobs, 0 failed" in result.stdout
    if launcher == "joblib":  # two jobs at once share the cores instead of each taking all of them
        threads = max(1, (os.cpu_count() or 1) // 2)
        assert f"TensorFlow threads: {threads} intra-op" in (Path(rows[0]["run_dir"]) / "run.log").read_text()


@pytest.mark.e2e
def test_a_failing_job_keeps_the_others_and_says_why(tmp_path):
    # The failure first: the sweep goes on. The three-layer test model: the point is the sweep, not VGG19.
    result, rows = _sweep(tmp_path, "trainer.label_smoothing=1.5,0.1", model="tiny")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [row["status"] for row in rows] == ["failed", "complete"]
    assert rows[1]["objective"] != ""
    assert rows[0]["error"] == "trainer.label_smoothing must be in [0, 1); got 1.5"
    assert "Sweep summary: 2 jobs, 1 failed" in result.stdout, "the table is printed"
    assert (
        result.stderr.strip().splitlines()[-1] == f"error: 1 of 2 jobs failed; see {tmp_path / 'sweep' / 'summary.csv'}"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sigterm_stops_a_grid_sweep_and_says_how_to_continue_its_job(tmp_path):
    """SIGTERM in job 0's first step: the sweep stops there with exit 130, as after Ctrl-C, and names the job to
    resume and that the later jobs did not run (it ran job 1 and exited 0, the stop unnoticed)."""
    data = write_cifar(tmp_path / "cifar")
    sweep = tmp_path / "sweep"
    arguments = ["-m", *tiny_overrides(data), f"hydra.sweep.dir={sweep}", "optimizer.lr=0.1,0.01"]
    stopped = run_patched(tmp_path, arguments, signal_in_first_step(signal.SIGTERM))
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert f"python run.py resume={sweep / '0'}" in last and "jobs after job 0 did not run" in last, last
    assert not (sweep / "1").exists()
    assert (sweep / "0" / "backup").is_dir()


@pytest.mark.unit
def test_best_table_rounds_the_figures():
    from trainer.tracking.sweep import best_table

    rows = [
        {
            "job": "0",
            "status": "complete",
            "objective": "0.11999999731779099",
            "val_accuracy": "0.11999999731779099",
            "test_accuracy": "0.1",
            "overrides": "optimizer.lr=0.1",
        },
        {
            "job": "1",
            "status": "complete",
            "objective": "0.5",
            "val_accuracy": "0.5",
            "test_accuracy": "",
            "overrides": "optimizer.lr=0.01",
        },
        {"job": "2", "status": "failed", "objective": "", "val_accuracy": "", "test_accuracy": "", "overrides": "x"},
    ]
    lines = best_table(rows, "max").splitlines()
    assert lines[1].split()[:3] == ["1", "0.5000", "0.5000"]
    assert lines[2].split() == ["0", "0.1200", "0.1200", "0.1000", "optimizer.lr=0.1"]
    assert len(lines) == 3, "the failed job is not ranked"


@pytest.mark.unit
def test_hparams_are_only_the_swept_keys_each_with_its_type():
    from tensorboard.plugins.hparams import api as hp

    from trainer.tracking.sweep import _hparam, swept_keys

    rows = [
        {"overrides": "optimizer.lr=0.01 trainer.epochs=2 trainer.verbose=0 model=vgg19 trainer.deterministic=true"},
        {"overrides": "optimizer.lr=0.1 trainer.epochs=4 trainer.verbose=0 model=custom trainer.deterministic=false"},
    ]
    keys = swept_keys(rows)
    assert list(keys) == ["model", "optimizer.lr", "trainer.deterministic", "trainer.epochs"], (
        "trainer.verbose is constant"
    )
    domains = {key: _hparam(key, values).domain for key, values in keys.items()}
    assert isinstance(domains["optimizer.lr"], hp.RealInterval) and domains["optimizer.lr"].max_value == 0.1
    assert isinstance(domains["trainer.epochs"], hp.IntInterval) and domains["trainer.epochs"].min_value == 2
    assert domains["trainer.deterministic"].values == [False, True]
    assert domains["model"].values == ["custom", "vgg19"]
