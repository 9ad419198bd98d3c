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
    "cli",
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
# Imported by any layer; each imports nothing of trainer's but the foundation modules after it (targets: errors;
# fields, the schemas' choices and range checks, used by the config's and the dataset formats' alike: errors).
FOUNDATION = ("targets", "fields", "errors", "quiet")
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
    if own in FOUNDATION:
        allowed = set(FOUNDATION[FOUNDATION.index(own) + 1 :])
    else:
        allowed = {*FOUNDATION, *LAYERS[LAYERS.index(own) :]}

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
    """Below them every function takes plain arguments: none imports OmegaConf or Hydra's config objects. `cli`,
    above the tasks, checks the command line against the composed config before Hydra starts."""
    readers = []
    for path in MODULES:
        own = path.relative_to(PACKAGE).parts[0]
        if own in ("cli", "tasks", "config"):
            continue
        text = path.read_text()
        if "omegaconf" in text or "DictConfig" in text or "HydraConfig" in text:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == ["trainer/search/sweeper.py", "trainer/tracking/sweep.py"], (
        "only the sweeper and the sweep callbacks, which Hydra itself calls"
    )


CONFIG_IMPORTERS = ("cli", "tasks", "config")  # the command line, the task layer, the config itself


def _config_imports(path: Path) -> list[str]:
    return sorted(module for module in _imports(path) if _layer(module) == "config")


def test_below_the_tasks_no_package_imports_the_config(tmp_path):
    """`search`, `training`, `serving` and `evaluation` sit above `config` in the import order, but below the task
    layer they take plain arguments: the tasks unpack the typed settings (`trainer.tasks.phases.compile_phase`,
    `search.trial.StudyTrial`). The sweeper, which Hydra itself builds, is handed its own keys and imports none."""
    importers = {
        str(path.relative_to(ROOT)): _config_imports(path)
        for path in MODULES
        if path.relative_to(PACKAGE).parts[0] not in CONFIG_IMPORTERS and _config_imports(path)
    }
    assert importers == {}, "pass plain arguments: only trainer/tasks/ (and cli/) unpack the config"
    hidden = tmp_path / "compiling.py"
    hidden.write_text("import trainer.config\ndef later():\n    from trainer.config.schema import Config\n")
    assert _config_imports(hidden) == ["trainer.config", "trainer.config.schema", "trainer.config.schema.Config"]


def _module_name(path: Path) -> str:
    parts = path.with_suffix("").relative_to(ROOT).parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The trainer modules a file imports, anywhere in it: `from trainer.x import y` is trainer.x.y where that is a
    module, else trainer.x itself (its `__init__`, which defines y)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer"):
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if inner in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("trainer"))
    return found


def _module_graph() -> dict[str, set[str]]:
    """Each module of trainer/ -> the modules of its own package it imports, anywhere in the file (deferred and
    `TYPE_CHECKING` imports included), the package's `__init__` among them."""
    modules = {_module_name(path) for path in MODULES}
    graph = {}
    for path in MODULES:
        name = _module_name(path)
        package = name.split(".")[:2]
        graph[name] = {module for module in _imported_modules(path, modules)
                       if module in modules and module != name and module.split(".")[:2] == package}  # fmt: skip
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_circle():
    assert _cycles(_module_graph()) == []


def test_the_circle_check_finds_a_lazy_or_type_checking_circle(tmp_path):
    graph = {"trainer.a.x": {"trainer.a.y"}, "trainer.a.y": {"trainer.a.z"}, "trainer.a.z": {"trainer.a.x"}}
    assert _cycles({**graph, "trainer.a.w": {"trainer.a.x"}}) == [["trainer.a.x", "trainer.a.y", "trainer.a.z"]]
    hidden = tmp_path / "phases.py"
    hidden.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.tasks.train import Plan\n"
        "def later():\n    from trainer.tasks import data\n"
    )
    assert {"trainer.tasks.train", "trainer.tasks.data"} <= _imports(hidden), "both count as imports"
    modules = {"trainer.tasks", "trainer.tasks.train", "trainer.tasks.data"}
    assert _imported_modules(hidden, modules) == {"trainer.tasks.train", "trainer.tasks.data"}
    through_init = tmp_path / "tta.py"
    through_init.write_text("from trainer.models import TTA\n")  # a name the package's __init__ defines
    assert _imported_modules(through_init, {"trainer.models", "trainer.models.tta"}) == {"trainer.models"}
    package = {"trainer.models": {"trainer.models.tta"}, "trainer.models.tta": {"trainer.models"}}
    assert _cycles(package) == [["trainer.models", "trainer.models.tta"]], "a circle through __init__ counts"


def test_records_are_opened_in_one_place_and_never_read_again_to_explain_them():
    """Issue 53: each record carries its file and number through the one pipeline, and its decoder says why it
    is bad; no module re-reads records in Python to name one (`record_rows.py` is gone), and TensorFlow's
    TFRecord reader is opened in at most two modules."""
    opening = sorted(
        str(path.relative_to(ROOT)) for path in MODULES if "TFRecordDataset(" in path.read_text().replace(" ", "")
    )
    assert len(opening) <= 2, opening
    assert not (PACKAGE / "data" / "record_rows.py").exists()
    for name in ("record_rows", "find_undecodable", "decode_each", "_checked_in_python", "op_error_reason"):
        users = [str(path.relative_to(ROOT)) for path in MODULES if name in path.read_text()]
        assert not users, f"{name} is still used in {users}"


MAX_LINES = 450  # the guide's "about 50 to 400 lines each"; past it, a module holds two jobs


def test_every_module_holds_one_job_within_about_400_lines():
    """A module over `MAX_LINES` is split where its jobs part, as the converter's command line (trainer/convert.py)
    and the headers of the one decode (trainer/data/headers.py) were."""
    long = {
        str(path.relative_to(ROOT)): lines
        for path in MODULES
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines: {long}"
