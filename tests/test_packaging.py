"""vggtrain as an installed tool: the `vggtrain` command, its configs inside the package, the wheel.

    pytest tests/test_packaging.py                  # the entry point, the package list, the config path
    pytest -m slow tests/test_packaging.py          # builds the wheel, installs it in a fresh venv, runs vggtrain

The wheel is built from a copy of the checkout and installed without downloading anything.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import venv
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import CONF, ROOT, run_cli

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")  # tomli: Python 3.10

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
USER_DATASET = """\
defaults:
  - folder          # vggtrain's conf/dataset/folder.yaml, found on the search path
  - _self_
name: mine
data_dir: photos
image_size: 32
val_fraction: 0.25
test_fraction: 0.25
"""


def _config_files() -> set[str]:
    """Every file of conf/ but its Python marker: what the wheel must carry."""
    return {
        path.relative_to(CONF).as_posix()
        for path in CONF.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.name != "__init__.py"
    }


def _user_folder(root: Path, per_class: int = 8) -> Path:
    """A user's folder: photos/<class>/*.png beside conf/dataset/mine.yaml, a group option of their own."""
    rng = np.random.default_rng(0)
    from PIL import Image

    for label, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        folder = root / "photos" / label
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = np.clip(np.array(colour) + rng.integers(-20, 20, (16, 16, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(folder / f"{index}.png")
    (root / "conf" / "dataset").mkdir(parents=True)
    (root / "conf" / "dataset" / "mine.yaml").write_text(USER_DATASET)
    return root


@pytest.mark.unit
def test_the_console_script_resolves_to_the_command():
    module, _, function = PYPROJECT["project"]["scripts"]["vggtrain"].partition(":")
    assert module in SETUPTOOLS["py-modules"], "the entry module must be in the wheel"
    entry = getattr(__import__(module), function)
    assert callable(entry)
    import vggtrain

    assert vggtrain.foreign_trainer() is None, "this checkout's trainer/ is vggtrain's"


@pytest.mark.unit
def test_every_package_of_trainer_is_listed_for_the_wheel():
    """pyproject lists the packages (conf/ installs as trainer.conf): a new package left out would be missing
    from the wheel and work only in a clone."""
    packages = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "trainer").rglob("__init__.py")}
    plugins = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "hydra_plugins").glob("*/__init__.py")}
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists(), "hydra_plugins is a namespace package"
    assert sorted(SETUPTOOLS["packages"]) == sorted({*packages, *plugins, "hydra_plugins", "trainer.conf"})
    assert SETUPTOOLS["package-dir"] == {"trainer.conf": "conf"}


@pytest.mark.unit
def test_the_package_data_takes_every_config_file():
    patterns = SETUPTOOLS.get("package-data", {})["trainer.conf"]
    taken = {match for pattern in patterns for match in glob.glob(pattern, root_dir=CONF, recursive=True)}
    assert _config_files() - taken == set(), "conf/ files the wheel would leave out"


@pytest.mark.unit
def test_the_config_path_finds_every_group_and_option():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from trainer.cli.main import CONFIG_DIR, CONFIG_PATH

    assert CONFIG_PATH == CONFIG_DIR == str(CONF), "in a clone: the checkout's own conf/"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            for group in sorted(path.parent for path in CONF.glob("*/*.yaml")):
                name = group.relative_to(CONF).as_posix()
                options = sorted(path.stem for path in group.glob("*.yaml"))
                assert set(options) <= set(loader.get_group_options(name)), name
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.unit
def test_a_wheels_packaged_configs_are_found_through_the_package(tmp_path):
    from trainer.cli.main import config_location

    installed = tmp_path / "site-packages" / "trainer"
    (installed / "conf").mkdir(parents=True)
    (installed / "conf" / "config.yaml").write_text("{}\n")
    assert config_location(installed) == ("pkg://trainer.conf", str(installed / "conf"))
    clone = tmp_path / "clone"
    (clone / "trainer").mkdir(parents=True)
    assert config_location(clone / "trainer") == (str(clone / "conf"), str(clone / "conf"))


@pytest.mark.integration
def test_shell_completion_installs_and_answers_for_the_command(monkeypatch):
    installed = run_cli(["-sc", "install=bash"])
    assert installed.returncode == 0, installed.stderr
    assert "hydra_bash_completion" in installed.stdout
    monkeypatch.setenv("COMP_LINE", "vggtrain optimizer=")
    answered = run_cli(["-sc", "query=bash"])
    assert answered.returncode == 0, answered.stderr
    assert set(answered.stdout.split()) >= {"optimizer=adam", "optimizer=adamw", "optimizer=sgd"}


@pytest.mark.integration
@pytest.mark.parametrize("search", [["--config-dir", "conf"], ["hydra.searchpath=[file://conf]"]])
def test_a_users_own_group_option_beside_their_photos_composes(tmp_path, search):
    root = _user_folder(tmp_path)
    result = run_cli([*search, "dataset=mine", "--cfg", "job"], cwd=root)
    assert result.returncode == 0, result.stderr
    dataset = yaml.safe_load(result.stdout)["dataset"]
    assert (dataset["name"], dataset["data_dir"], dataset["_target_"]) == (
        "mine",
        "photos",
        "trainer.data.formats.folder.ImageFolder",
    )
    assert dataset["augment"]["flip"] is True, "the rest comes from vggtrain's own dataset=folder"


@pytest.mark.e2e
def test_another_package_named_trainer_first_on_the_path_is_one_line(tmp_path):
    fake = tmp_path / "elsewhere" / "trainer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("print('the other trainer ran')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", "import sys, vggtrain; sys.exit(vggtrain.main())", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == "", "the other package is never imported"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: `import trainer` finds another package, {fake}, not vggtrain's")


def _wheel(tmp_path: Path) -> Path:
    """The wheel built from a copy of this checkout's files (tracked, and new ones git does not ignore), so no
    stale build/ folder or egg-info of the checkout leaks into it. Nothing is downloaded."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    source = tmp_path / "source"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    build = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), "-q"], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("vggtrain-*.whl")
    return wheel


def _command(venv_dir: Path, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the venv's trainer only
    return subprocess.run(
        [str(venv_dir / "bin" / arguments[0]), *arguments[1:]],
        cwd=cwd, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_the_wheel_installs_a_vggtrain_command_that_trains_from_an_empty_folder(tmp_path):
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"trainer", "hydra_plugins", "vggtrain.py", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert {f"trainer/conf/{name}" for name in _config_files()} <= set(names), "every config travels"
    assert {"trainer/conf/__init__.py", "trainer/data/digits/train.bin", "trainer/cli/main.py"} <= set(names)
    assert "hydra_plugins/__init__.py" not in names, "a namespace package: it would hide the other plugins"

    venv_dir = tmp_path / "venv"
    venv.create(venv_dir, system_site_packages=True, with_pip=True)
    install = [str(venv_dir / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)

    checked = _command(venv_dir, "python", "-m", "pip", "check", cwd=tmp_path)
    broken = [line for line in checked.stdout.splitlines() if line and not line.startswith("No broken")]
    assert [line for line in broken if line.lower().startswith("vggtrain")] == [], checked.stdout
    if broken:  # the system's own packages, seen through --system-site-packages: not vggtrain's to fix
        warnings.warn(f"pip check, unrelated to vggtrain: {broken}", stacklevel=1)

    empty = tmp_path / "empty"
    empty.mkdir()
    found = _command(venv_dir, "python", "-c", "import trainer; print(trainer.__file__)", cwd=empty)
    assert Path(found.stdout.strip()).is_relative_to(venv_dir), "the installed package, not this checkout"
    helped = _command(venv_dir, "vggtrain", "--help", cwd=empty)
    assert helped.returncode == 0, helped.stderr
    assert "vggtrain" in helped.stdout and "dataset: " in helped.stdout  # the groups, from the packaged configs

    trained = _command(venv_dir, "vggtrain", "debug=smoke", cwd=empty)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert [path.name for path in empty.iterdir()] == ["outputs"]
    (run,) = [path.parent for path in empty.glob("outputs/*/*/metrics.json")]
    assert (run / "run.log").is_file() and (run / "checkpoints" / "best.keras").is_file()
    hydra = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert {"provider": "main", "path": "trainer.conf", "schema": "pkg"} in hydra["runtime"]["config_sources"]

    exported = _command(venv_dir, "vggtrain", "mode=export", f"checkpoint={run}", "export.dir=served", cwd=empty)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads((empty / "served" / "serving_info.json").read_text())

    user = _user_folder(tmp_path / "user")
    mine = ["--config-dir", "conf", "dataset=mine", "debug=smoke", "trainer.batch_size=4"]
    trained = _command(venv_dir, "vggtrain", *mine, cwd=user)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = [path.parent for path in user.glob("outputs/*/*/metrics.json")]
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert (config["dataset"]["name"], config["dataset"]["data_dir"]) == ("mine", "photos")
