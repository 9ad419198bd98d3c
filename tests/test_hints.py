"""Options that need the [sweep] extra say so, in one line, when its plugin is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from trainer.cli.hints import missing_extra


def _nothing_installed(module: str) -> bool:
    return False


@pytest.mark.unit
@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["-m", "hparams_search=vgg19_optuna"], "hparams_search=vgg19_optuna needs the [sweep] extra"),
        (["launcher=joblib", "-m"], "launcher=joblib needs the [sweep] extra (hydra_plugins.hydra_joblib_launcher"),
        (["+launcher=slurm"], "launcher=slurm needs the [sweep] extra (hydra_plugins.hydra_submitit_launcher"),
        (["hydra/sweeper=vggtrain_optuna"], "hydra/sweeper=vggtrain_optuna needs the [sweep] extra (optuna"),
        (["launcher=null", "hparams_search=null", "optimizer.lr=0.1"], None),
    ],
)
def test_a_missing_plugin_names_the_extra(arguments, expected):
    hint = missing_extra(arguments, _nothing_installed)
    assert hint == expected if expected is None else hint.startswith(expected) and "pip install" in hint


@pytest.mark.unit
def test_installed_plugins_give_no_hint():
    assert missing_extra(["hparams_search=vgg19_optuna", "launcher=joblib"], lambda module: True) is None


@pytest.mark.unit
def test_the_old_optuna_sweeper_names_ours():
    hint = missing_extra(["hydra/sweeper=optuna"], lambda module: True)
    assert hint.startswith("hydra/sweeper=optuna is hydra-optuna-sweeper (Optuna < 3)") and "vggtrain_optuna" in hint


BLOCK = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
sys.argv = ["run.py", "-m", "hparams_search=vgg19_optuna"]
runpy.run_path("run.py", run_name="__main__")
"""


@pytest.mark.e2e
def test_run_py_says_which_extra_to_install(tmp_path):
    result = subprocess.run([sys.executable, "-c", BLOCK], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: hparams_search=vgg19_optuna needs the [sweep] extra (optuna is not installed): "
        "pip install 'vggtrain[sweep]' (from a clone: pip install -e '.[sweep]')"
    ]
