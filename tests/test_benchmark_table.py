"""`python -m benchmarks --check` fails when a row misses its target; `--markdown` prints the docs' table."""

from __future__ import annotations

import re
import subprocess

import pytest

import benchmarks.__main__ as bench
from benchmarks.common import ROOT, Row

pytestmark = pytest.mark.unit

ROWS = [
    Row("pipeline vs textbook", 300.0, 100.0, "img/s", 2.0),
    Row("  peak memory vs budget", 900.0, 1000.0, "MiB", 1.0, higher_is_better=False),
    Row("report only", 5.0, 4.0, "s", None),
]


def _main(monkeypatch, rows, *arguments):
    monkeypatch.setattr(bench, "run_case", lambda name, folder, quick: rows)
    return bench.main(["--only", "demo", *arguments])


def test_check_passes_when_every_row_meets_its_target(monkeypatch, capsys):
    assert _main(monkeypatch, ROWS, "--check") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["figure", "ours", "baseline"] and table[2].endswith("yes")


def test_check_fails_naming_the_rows_that_miss(monkeypatch, capsys):
    missed = [*ROWS, Row("worker share", 0.7, 1.0, "records", 0.55, higher_is_better=False)]
    assert _main(monkeypatch, missed, "--check") == 1
    assert "1 row(s) missed their target: worker share" in capsys.readouterr().err
    assert _main(monkeypatch, missed) == 0, "without --check the table is only printed"


def test_markdown_is_the_page_headed_by_how_it_was_measured(monkeypatch, capsys):
    assert _main(monkeypatch, ROWS, "--markdown") == 0
    page = capsys.readouterr().out
    assert page.startswith(bench.PAGE_INTRO + "\n\n")
    lines = page.removeprefix(bench.PAGE_INTRO + "\n\n").splitlines()
    assert lines[0] == "## demo"
    assert lines[2].startswith("Measured by `python -m benchmarks --only demo` on ")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode == 0:  # a git checkout: the table names the commit it measured
        assert re.search(rf" at commit {commit.stdout.strip()}(\+changes)? \(", lines[2]), lines[2]
    assert lines[4] == "| figure | ours | baseline | unit | ratio | target | met |"
    assert lines[6] == "| pipeline vs textbook | 300.0 | 100.0 | img/s | 3.00 | >= 2 | yes |"
    assert lines[8] == "| report only | 5.0 | 4.0 | s | 1.25 | report | - |"


def test_update_remeasures_only_the_cases_run(monkeypatch, tmp_path, capsys):
    """`--only demo --update PAGE` replaces the demo's section and keeps the others as they were measured."""
    page = tmp_path / "benchmarks.md"
    monkeypatch.setattr(bench, "run_case", lambda name, folder, quick: [Row(f"{name} row", 1.0, 1.0, "s", None)])
    assert bench.main(["--only", "serving", "demo", "--update", str(page)]) == 0
    first = page.read_text()
    assert first.index("## serving") < first.index("## demo"), "sections follow the order of the cases"
    monkeypatch.setattr(bench, "run_case", lambda name, folder, quick: [Row("demo again", 2.0, 1.0, "s", None)])
    assert bench.main(["--only", "demo", "--update", str(page)]) == 0
    sections = bench.page_sections(page.read_text())
    assert set(sections) == {"serving", "demo"}
    assert sections["serving"] == bench.page_sections(first)["serving"], "a section not run is kept as it was"
    assert "| demo again | 2.0 | 1.0 | s | 2.00 | report | - |" in sections["demo"]
    assert "demo row" not in page.read_text()
    capsys.readouterr()


def test_update_keeps_a_failed_cases_section(monkeypatch, tmp_path):
    page = tmp_path / "benchmarks.md"
    monkeypatch.setattr(bench, "run_case", lambda name, folder, quick: [Row("old", 1.0, 1.0, "s", None)])
    assert bench.main(["--only", "demo", "--update", str(page)]) == 0

    def fails(name, folder, quick):
        raise subprocess.CalledProcessError(1, "case")

    monkeypatch.setattr(bench, "run_case", fails)
    assert bench.main(["--only", "demo", "--update", str(page)]) == 1
    assert "| old |" in page.read_text()


def test_the_flop_count_of_vgg19_is_the_published_one():
    """keras.applications.VGG19: 19.6 G multiply-adds per 224x224 image (Simonyan and Zisserman's figure), 2 FLOPs
    each; and a one-convolution model by hand."""
    import keras

    from benchmarks.flops import model_flops

    assert model_flops(keras.applications.VGG19(weights=None)) == pytest.approx(2 * 19.63e9, rel=0.005)
    inputs = keras.Input((8, 8, 3))
    conv = keras.layers.Conv2D(4, 3, padding="valid")(inputs)  # 6x6x4 outputs, 27 multiply-adds each
    model = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.Flatten()(conv)))
    assert model_flops(model) == 2 * (6 * 6 * 4 * 27) + 2 * (144 * 5)


def test_the_search_case_reuses_the_searches_that_finished_at_the_same_code(monkeypatch, tmp_path):
    """A case cut short (a search that died) kept none of its searches' counts: an hour of searches ran again."""
    import json

    import benchmarks.search as search

    ran = []

    def fake_search(folder, seed, preset, pruner):  # a search's trial folders, as run.py -m writes them
        ran.append(folder.name)
        for trial in range(search.TRIALS):
            (folder / str(trial)).mkdir(parents=True)
            metrics = {"objective": 0.9 + trial / 1000, "pruned": False, "epochs_completed": search.EPOCHS}
            (folder / str(trial) / "metrics.json").write_text(json.dumps(metrics))

    monkeypatch.setattr(search, "ROOT", tmp_path)
    monkeypatch.setattr(search, "_search", fake_search)
    monkeypatch.setattr(search, "code_key", lambda: "abc")
    search.search_pruning(tmp_path, quick=True)
    assert ran == ["unpruned_0", "asha_0"]
    kept = tmp_path / "outputs" / "benchmarks" / "search_pruning" / "abc"
    (kept / "asha_0" / "3" / "metrics.json").unlink()  # cut short: 15 of 16 trials
    rows = search.search_pruning(tmp_path, quick=True)
    assert ran == ["unpruned_0", "asha_0", "asha_0"]  # the finished search reused, the cut one run again
    assert rows[0].ours == rows[0].baseline == search.TRIALS * search.EPOCHS
    monkeypatch.setattr(search, "code_key", lambda: "changed")
    search.search_pruning(tmp_path, quick=True)
    assert ran[3:] == ["unpruned_0", "asha_0"]  # other code: nothing reused
