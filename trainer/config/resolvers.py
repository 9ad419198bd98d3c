"""The OmegaConf resolvers `conf/config.yaml` uses to name run folders, and `${bundled:...}` for shipped data.

    hydra.run.dir: ${worker_dir:outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}${run_label:},${resume}}

They run while Hydra composes the config, before any task: they read only the raw
config (`_root_`) and never import TensorFlow.
"""

from __future__ import annotations

import functools
import re
import tempfile
from importlib import resources

from omegaconf import DictConfig, OmegaConf

from trainer.distribute import cluster
from trainer.errors import ConfigError
from trainer.runs import folders


def bundled_data(name: str) -> str:
    """Path of a dataset shipped inside the package, for `${bundled:digits}` in YAML."""
    return str(resources.files("trainer.data") / name)


def worker_dir(path: str, resume: str | None = None, *, _root_: DictConfig) -> str:
    """The run folder for the chief (and outside multi-worker runs), else a fresh temporary folder.

    Used as `hydra.run.dir: ${worker_dir:PATH,${resume}}`, so only the chief writes into `outputs/`.
    The chief's folder is `resume`'s run folder when resuming, else a new folder claimed at PATH
    (PATH-2, PATH-3... when a run started in the same second has it).
    """
    strategy = _root_.get("strategy") or {}
    if getattr(OmegaConf.get_type(strategy), "SPANS_WORKERS", False):  # its schema: strategy=multi_worker
        try:
            settings = (strategy.get("cluster", "auto"), strategy.get("workers"), strategy.get("task_index"))
            chief = cluster.worker_role(*settings).is_chief
        except ConfigError:  # raised here, Hydra would print a traceback: the strategy's build says it in one line
            chief = False  # and nothing is written to outputs/ meanwhile
        if not chief:
            return _temporary_folder(path)
    return folders.resume_folder(resume) if resume else folders.claim_new_folder(path)


def run_label(*, _root_: DictConfig) -> str:
    """`_NAME_TAG1-TAG2` from `name=` and `tags=` for the run folder's name (characters outside
    [A-Za-z0-9.-] become -), or '' without them. Used as `${run_label:}` in `hydra.run.dir`."""
    name, tags = _root_.get("name"), _root_.get("tags")
    parts = [name or "", "-".join(str(tag) for tag in (tags or []))]
    label = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", part).strip("-") for part in parts if part)
    return f"_{label[:80]}" if label else ""


@functools.cache
def _temporary_folder(path: str) -> str:
    """One temporary folder per run path and process, however often Hydra resolves it."""
    return tempfile.mkdtemp(prefix=cluster.WORKER_PREFIX)


UNSET_RUN_FOLDER = "(the run folder, made when a run starts)"


def run_folder() -> str:
    """The run's folder, Hydra's `runtime.output_dir`; outside a run (`python run.py --cfg job --resolve`)
    words that say so, where `${hydra:runtime.output_dir}` gave None and a 40-line traceback."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return UNSET_RUN_FOLDER
    runtime = HydraConfig.get().runtime
    return OmegaConf.select(runtime, "output_dir", throw_on_missing=False) or UNSET_RUN_FOLDER


def optuna_direction(mode: str) -> str:
    """`objective.mode` as the Optuna sweeper's `direction`."""
    return "maximize" if mode == "max" else "minimize"


RESOLVERS = {
    "bundled": bundled_data,
    "optuna_direction": optuna_direction,
    "worker_dir": worker_dir,
    "hydra_subdir": folders.hydra_subdir,
    "run_label": run_label,
    "run_folder": run_folder,
}


def register_resolvers() -> None:
    """Registers every resolver once (`new_folder` caches its answer: one folder per sweep)."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
    if not OmegaConf.has_resolver("new_folder"):
        OmegaConf.register_new_resolver("new_folder", folders.claim_new_folder, use_cache=True)
