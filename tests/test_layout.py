"""One house: every import in `trainer/` points down the layers; only the tasks and the config read the config."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

# Top to bottom: a package may import itself and the packages after it, never one before it. `config` sits
# above `models` only to read the models' smallest input sizes (trainer/models/__init__.py, no Keras).
LAYERS = (
    "tasks",
    "search",
    "training",
    "serving",
    "evaluation",
    "config",
    "models",
    "tracking",
    "data",
    "runs",
    "distribute",
)
FOUNDATION = ("errors", "quiet")  # imported by any layer; they import nothing of trainer's
ENTRY_POINTS = ("convert",)  # `python -m trainer.convert`: may import anything
PACKAGE = ROOT / "trainer"


def _imports(path: Path) -> set[str]:
    """The trainer.* modules a file imports, anywhere in it (deferred imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("trainer"))
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(path.relative_to(ROOT)) for path in MODULES])
def test_every_import_points_down(path):
    own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    if own in ENTRY_POINTS or own == "__init__":
        return
    allowed = set() if own in FOUNDATION else {*FOUNDATION, *LAYERS[LAYERS.index(own) :]}
    upward = sorted(
        module
        for module in _imports(path)
        if _layer(module) in (*LAYERS, *FOUNDATION, *ENTRY_POINTS) and _layer(module) not in allowed
    )
    assert upward == [], f"{path.relative_to(ROOT)} ({own}) imports {upward}"


def test_the_layers_are_the_packages():
    packages = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    modules = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")
    assert packages == sorted(LAYERS)
    assert modules == sorted((*FOUNDATION, *ENTRY_POINTS)), "a flat module of trainer/ belongs in a layer"


def test_only_tasks_and_config_read_the_hydra_config():
    """Below them every function takes plain arguments: none imports OmegaConf or Hydra's config objects."""
    readers = []
    for path in MODULES:
        own = path.relative_to(PACKAGE).parts[0]
        if own in ("tasks", "config"):
            continue
        text = path.read_text()
        if "omegaconf" in text or "DictConfig" in text or "HydraConfig" in text:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == ["trainer/search/sweeper.py", "trainer/tracking/sweep.py"], (
        "only the sweeper and the sweep callbacks, which Hydra itself calls"
    )
