"""What a new user meets first: `python run.py`'s start-up and the digits demo against its goal.

python -m benchmarks --only startup demo
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, Row

# Targets, not measurements: the baseline column of the demo rows.
DEMO_BUDGET_SECONDS = 60.0  # `python run.py` on the bundled digits: at most a minute of training on 2 cores ...
DEMO_ACCURACY = 0.99  # ... to at least 99% test accuracy


def _time_until(command: list[str], marker: str | None, cwd: Path) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    elapsed = None
    for line in process.stdout:
        if marker and marker in line and elapsed is None:
            elapsed = time.perf_counter() - started
    process.wait()
    if process.returncode:
        raise RuntimeError(f"{command} failed with exit code {process.returncode}")
    return elapsed if marker else time.perf_counter() - started


def startup(folder: Path, quick: bool) -> list[Row]:
    run = [sys.executable, str(ROOT / "run.py"), "debug=smoke", f"hydra.run.dir={folder / 'startup'}"]
    first_step = min(_time_until(run, "First training step", folder) for _ in range(1 if quick else 2))
    imports = min(
        _time_until([sys.executable, "-c", "import tensorflow, keras"], None, folder) for _ in range(1 if quick else 2)
    )
    return [
        Row(
            "Start-up: run.py debug=smoke to first step vs import tensorflow, keras",
            first_step,
            imports,
            "s",
            None,
            higher_is_better=False,
        )
    ]


def demo(folder: Path, quick: bool) -> list[Row]:
    """`python run.py` as the README's first command runs it (the bundled digits, every default): its seconds of
    training against the one-minute budget, and its test accuracy against 99%. Both baselines are targets."""
    run_dir = folder / "demo_run"
    extra = ["trainer.epochs=1"] if quick else []
    command = [sys.executable, str(ROOT / "run.py"), f"hydra.run.dir={run_dir}", *extra]
    subprocess.run(command, cwd=folder, capture_output=True, text=True, check=True)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return [
        Row(
            "Digits demo `python run.py`: seconds of training (baseline column = the 60 s budget, a target)",
            metrics["train_seconds"],
            DEMO_BUDGET_SECONDS,
            "s",
            1.0,
            higher_is_better=False,
        ),
        Row(
            "Digits demo: test accuracy (baseline column = the 99% goal, a target)",
            100 * metrics["test_accuracy"],
            100 * DEMO_ACCURACY,
            "%",
            1.0,
        ),
    ]
