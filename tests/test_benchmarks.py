"""`python -m benchmarks --quick` runs every row and prints the table (slow: `pytest -m slow`).

Only that the benchmarks run and report is checked here; their ratios are the
point of running them by hand, never asserted in a test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import cases
from conftest import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_quick_benchmarks_print_every_row():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["figure", "ours", "baseline"]
    for name in cases.CASES:
        assert f"# {name} took" in result.stderr
    rows = lines[2:]
    assert len(rows) >= len(cases.CASES)
    assert all(row.split()[-1] in ("yes", "NO", "-") for row in rows)


@pytest.mark.slow
def test_the_gpu_check_runs_its_every_path_at_toy_sizes_on_the_cpu():
    result = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu-smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = [line.split("  ")[0] for line in result.stdout.splitlines()[2:]]
    assert any("float32, XLA off (run.py path vs plain Keras)" in figure for figure in figures)
    assert any("mixed_bfloat16, XLA off" in figure for figure in figures)
    assert "XLA on: skipped" in result.stderr  # no XLA on the CPU
    assert sum("Input-bound ratio" in figure for figure in figures) == 2
    assert sum("Inference latency per image" in figure for figure in figures) == 12  # 6 formats x 2 batches


@pytest.mark.slow
def test_the_folder_rows_time_both_pipelines_on_the_same_folders(tmp_path):
    from benchmarks.__main__ import run_case

    rows = run_case("folder_pipeline", str(tmp_path), quick=True)
    assert [row.figure.split(", ")[-1] for row in rows] == [
        "500x375 JPEG -> 224",
        "4000x3000 JPEG phone photos -> 224",
        "500x375 JPEG -> 224",
    ]
    assert all(row.ours > 0 and row.baseline > 0 and row.unit == "img/s" for row in rows)
    assert [row.target for row in rows] == [None, 1.4, 0.95]  # issue 53's floor: like for like, phone photos


@pytest.mark.slow
def test_the_source_rows_time_ours_and_the_textbook_on_the_same_data(tmp_path):
    from benchmarks.__main__ import run_case

    rows = [
        row
        for name in ("parquet_pipeline", "tfds_pipeline", "predict_records")
        for row in run_case(name, str(tmp_path), quick=True)
    ]
    assert [row.figure.split(" vs ")[0] for row in rows] == ["dataset=parquet", "dataset=tfds", "mode=predict"]
    assert all(row.ours > 0 and row.baseline > 0 and row.unit == "img/s" for row in rows)
    assert [row.target for row in rows] == [2.0, 0.95, 0.8]
    predictions = (tmp_path / "predict_0" / "predictions.csv").read_text().splitlines()
    assert len(predictions) == 1 + round(256 * 0.9), "every test record predicted once"
