"""Hints before Hydra starts: an option that needs an optional extra says which one to install.

    python run.py -m hparams_search=vgg19_optuna   # without the [sweep] extra: one line naming it

Without the plugin, Hydra would stop with its raw `Could not find 'hydra/sweeper/...'`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable

# (override prefix, option or "" for any, module the option needs)
PLUGINS = (
    ("hparams_search", "", "optuna"),  # vggtrain's own sweeper (hydra_plugins.vggtrain_optuna_sweeper)
    ("hydra/sweeper", "vggtrain_optuna", "optuna"),
    ("launcher", "joblib", "hydra_plugins.hydra_joblib_launcher"),
    ("hydra/launcher", "joblib", "hydra_plugins.hydra_joblib_launcher"),
    ("launcher", "slurm", "hydra_plugins.hydra_submitit_launcher"),
    ("launcher", "local", "hydra_plugins.hydra_submitit_launcher"),
    ("hydra/launcher", "submitit_slurm", "hydra_plugins.hydra_submitit_launcher"),
    ("hydra/launcher", "submitit_local", "hydra_plugins.hydra_submitit_launcher"),
)
INSTALL = "pip install 'vggtrain[sweep]' (from a clone: pip install -e '.[sweep]')"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (hydra_plugins) is missing too
        return False


def missing_extra(arguments: Iterable[str], installed: Callable[[str], bool] = _installed) -> str | None:
    """The error line for the first command-line option whose Hydra plugin is not installed, else None."""
    for argument in arguments:
        key, separator, value = argument.lstrip("+").partition("=")
        if not separator or not value or value == "null":
            continue
        if key == "hydra/sweeper" and value == "optuna":  # hydra-optuna-sweeper: held at optuna<3
            return (
                "hydra/sweeper=optuna is hydra-optuna-sweeper (Optuna < 3); vggtrain's sweeper is "
                "hydra/sweeper=vggtrain_optuna, the one hparams_search=vgg19_optuna uses"
            )
        for group, option, module in PLUGINS:
            if key == group and option in ("", value) and not installed(module):
                return f"{key}={value} needs the [sweep] extra ({module} is not installed): {INSTALL}"
    return None
