"""Docs that cannot go stale: every `trainer/...` path, `trainer.x.y` name, `tests/file.py::test`, `SomeConfig in
trainer/x.py` and `README "Section"` (or `docs/page.md, "Section"`) that the docs, the configs, the README and the
code's own comments name exists."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from conftest import ROOT
from trainer.config.legacy import MOVED_PARTS  # the old names a saved run may hold: named on purpose
from trainer.config.schema import TrainerConfig

pytestmark = pytest.mark.unit

TEXTS = sorted(
    [
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("conf/**/*.yaml"),
        ROOT / "README.md",
        ROOT / "run.py",
        *ROOT.glob("trainer/**/*.py"),
        *ROOT.glob("benchmarks/*.py"),
        *ROOT.glob("tools/*.py"),
        *ROOT.glob("hydra_plugins/**/*.py"),
    ]
)
PATH = re.compile(r"(?<![\w/.])trainer/[\w/.]*\w")
# Not a Kubernetes API group or label key (`apiVersion: trainer.kubeflow.org/v1alpha1`): a `/` follows those.
DOTTED = re.compile(r"(?<![\w/.])trainer(?:\.[A-Za-z_]\w*)+(?![\w.]*/)")
TEST = re.compile(r"(?<![\w/.])(tests/[\w/]+\.py)(?:::(\w+))?")
CLASS_IN = re.compile(r"\b([A-Z]\w+) in (trainer/[\w/]+\.py)")
SECTION = re.compile(r"\b(README|docs/[\w/-]+\.md),? \"([^\"]+)\"")  # README "Multi-worker training"
# `trainer.epochs` is a key of the config's `trainer` section, not a module; these two name keys on purpose.
CONFIG_KEYS = {field.name for field in dataclasses.fields(TrainerConfig)} | {"KEY", "epoch"}  # a placeholder, a typo


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _resolves(dotted: str) -> bool:
    """Whether `trainer.a.b.C` is a module, or a module's top-level name (a class, function or constant)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        file = next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)
        if file is not None:
            return cut == len(parts) or parts[cut] in _top_level_names(file)
    return False


def _stale(text: Path) -> list[str]:
    content, found = text.read_text(), []
    for match in PATH.finditer(content):
        if not (ROOT / match.group(0)).exists():
            found.append(match.group(0))
    for match in DOTTED.finditer(content):
        dotted = match.group(0)
        if dotted.split(".")[1] not in CONFIG_KEYS and dotted not in MOVED_PARTS and not _resolves(dotted):
            found.append(dotted)
    for path, test in TEST.findall(content):
        if not (ROOT / path).is_file() or (test and test not in _top_level_names(ROOT / path)):
            found.append(f"{path}::{test}" if test else path)
    for name, path in CLASS_IN.findall(content):
        if (ROOT / path).is_file() and name not in _top_level_names(ROOT / path):
            found.append(f"{name} in {path}")
    for page, title in SECTION.findall(content):
        page = "README.md" if page == "README" else page
        headings = re.findall(r"^#+ (.+?)\s*$", (ROOT / page).read_text(), re.M) if (ROOT / page).is_file() else []
        if title not in headings:
            found.append(f'{page} "{title}"')
    return found


@pytest.mark.parametrize("text", TEXTS, ids=[str(path.relative_to(ROOT)) for path in TEXTS])
def test_every_path_and_module_named_exists(text):
    assert _stale(text) == []


def test_the_check_finds_a_moved_module_a_missing_file_and_a_class_in_the_wrong_file(tmp_path):
    text = tmp_path / "page.md"
    text.write_text(
        "See trainer/compat.py, trainer.backup.save, trainer.runs.backup.RunBackup, trainer/runs/backup.py,\n"
        "VGG19Config in trainer/config/schema.py, VGG19Config in trainer/config/groups.py and trainer.epochs=5.\n"
        "tests/test_layout.py::test_no_module_imports_itself_round_a_circle, tests/test_layout.py::test_gone."
    )
    assert _stale(text) == [
        "trainer/compat.py", "trainer.backup.save", "tests/test_layout.py::test_gone",
        "VGG19Config in trainer/config/schema.py",
    ]  # fmt: skip
