"""The README's promise: `python run.py` on the bundled digits reaches at least 97% test accuracy.

Slow (about a minute on 2 cores): `pytest -m slow`. The wall time is printed, not asserted
(timing targets live in benchmarks, not tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_default_run_reaches_97_percent_on_the_digits(tmp_path):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print(f"digits demo: test accuracy {metrics['test_accuracy']:.4f} in {seconds:.0f} s wall")
    assert metrics["test_accuracy"] >= 0.97
    assert metrics["epochs_completed"] == 20
