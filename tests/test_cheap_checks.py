"""Cheap checks first: every check that needs no data (the checkpoint, the option ranges, the export folder) is one
line before any photo is decoded, and a folder mode decodes only the splits it reads."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_folder import make_folder

from conftest import run_cli
from trainer.runs import checkpoints


def _folder(tmp_path: Path) -> list[str]:
    return ["dataset=folder", f"dataset.data_dir={make_folder(tmp_path / 'photos', 'splits', per_class=8)}",
            "dataset.image_size=32", "debug=smoke"]  # fmt: skip


@pytest.mark.integration
def test_a_bad_checkpoint_or_option_is_one_line_before_any_photo_is_decoded(tmp_path, decoded, capsys):
    """`mode=evaluate checkpoint=RUN` on a run without a checkpoint decoded the whole photo folder before saying
    so; so did a mistyped `checkpoint=` and an export folder that exists. Each is one line now, no photo decoded."""
    folder = _folder(tmp_path)
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "taken").mkdir()
    cases = {
        "missing": (["mode=evaluate", f"checkpoint={tmp_path / 'typo.keras'}"], "no such file or run folder"),
        "no checkpoint": (["mode=evaluate", f"checkpoint={tmp_path / 'empty_run'}"], "holds no checkpoints/best.keras"),
        "export missing": (["mode=export", f"checkpoint={tmp_path / 'typo'}", f"export.dir={tmp_path / 'new'}"],
                           "no such file or run folder"),
        "export folder": (["mode=export", f"checkpoint={tmp_path / 'typo'}", f"export.dir={tmp_path / 'taken'}"],
                          "already exists"),
        "dropout": (["model.dropout=1.0"], "model.dropout"),
    }  # fmt: skip
    for name, (arguments, expected) in cases.items():
        started = time.monotonic()
        result = run_cli([*folder, *arguments, f"hydra.run.dir={tmp_path / 'runs' / name}"], cwd=tmp_path)
        seconds = time.monotonic() - started
        lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert result.returncode == 1 and "Traceback" not in result.stderr, (name, result.stderr[-2000:])
        assert len(lines) == 1 and expected in lines[0], (name, result.stderr[-2000:])
        assert decoded == [], f"{name}: {len(decoded)} photos decoded before the line"
        with capsys.disabled():
            print(f"\n{name}: one line in {seconds:.2f} s, no photo decoded")


@pytest.mark.integration
def test_evaluate_on_the_test_split_decodes_no_training_image(tmp_path, decoded, trained_run, monkeypatch):
    """`mode=evaluate evaluate.split=test` decoded every split at start-up. The evaluation itself is left out
    here (what is counted is what the data check decodes; tests/test_evaluate.py evaluates)."""
    from trainer.tasks import evaluate

    _, run_dir = trained_run
    info = checkpoints.info_of(run_dir)
    root = tmp_path / "photos"
    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        for name in info.class_names:
            (root / split / name).mkdir(parents=True)
            pixels = rng.integers(0, 256, (info.image_size, info.image_size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / split / name / "0.png")
    evaluated = {"accuracy": 1.0, "loss": 0.0}
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *arguments: dict(evaluated))
    common = ["mode=evaluate", f"checkpoint={run_dir / checkpoints.BEST}", "dataset=folder",
              f"dataset.data_dir={root}", f"dataset.image_size={info.image_size}", "evaluate.split=test"]  # fmt: skip
    for report, splits in (("false", {"test"}), ("true", {"test", "val"})):  # the report's temperature: val
        decoded.clear()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / f"cache_{report}"))  # no verdict of the pass before
        arguments = [*common, f"evaluate.report={report}", f"hydra.run.dir={tmp_path / report}"]
        result = run_cli(arguments, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert {Path(path).relative_to(root).parts[0] for path in decoded} == splits, "no train photo decoded"
        assert len(decoded) == len(splits) * len(info.class_names), "each photo of those splits once"
