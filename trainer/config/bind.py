"""A resumed run trains with its own config: `resume=RUN` binds the command line to RUN/.hydra/config.yaml.

    python run.py resume=outputs/2026-11-30/12-00-00 trainer.epochs=40     # more epochs: allowed, logged
    python run.py resume=RUN optimizer=sgd                                  # another experiment: refused

Only settings that do not change what is trained may differ from the run's own
(verbosity, threads, more epochs, moved data, trackers, labels, worker addresses);
anything else is one error naming each key with both values.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.config import reuse
from trainer.errors import ConfigError

log = logging.getLogger(__name__)


# Keys a resumed run may change: they do not change what is being trained.
SAFE_KEYS = (
    *("trainer.verbose", "trainer.threads", "trainer.save_every_steps", "trainer.time_budget"),
    *("dataset.data_dir", "allow_data_change"),
)
SAFE_PREFIXES = (
    *("strategy.workers", "strategy.task_index", "strategy.cluster"),
    *("strategy.timeout_seconds", "strategy.heartbeat_seconds", "strategy.startup_timeout"),
    "strategy.slurm_port_base",
    *("name", "tags", "logger"),  # labels and trackers: what is trained stays the same
)
# Keys of this invocation, taken from the command line. Unlike evaluate (reuse.INVOCATION_KEYS), a
# resumed run keeps its strategy: another replica count changes the experiment.
RESUME_KEEPS = tuple(key for key in reuse.INVOCATION_KEYS if key != "strategy")


def _leaves(cfg: DictConfig) -> dict[str, Any]:
    def flatten(node: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(node, dict):
            return {prefix[:-1]: node}
        return {key: value for name, child in node.items() for key, value in flatten(child, f"{prefix}{name}.").items()}

    leaves = flatten(OmegaConf.to_container(cfg, resolve=False), "")
    return {key: value for key, value in leaves.items() if not _is_under(key, RESUME_KEEPS)}


def _shown(value: Any) -> Any:
    """A config value as the user types it (an enum's value, not its repr)."""
    return value.value if isinstance(value, enum.Enum) else value


def _is_under(key: str, prefixes: Sequence[str]) -> bool:
    """Whether `key` is one of `prefixes` or lies below one (`model` is not below `mode`)."""
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def bind_to_run(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> DictConfig:
    """The config a resumed run trains with: the run's own (`RUN/.hydra/config.yaml`, read by
    `trainer.config.reuse`), plus the command line's overrides of keys that are safe to change
    (logged); `cfg` itself if the run saved no config.

    Raises:
        ConfigError: the command line changes the experiment (dataset, model, optimizer, batch size,
            seed, precision, strategy, fewer epochs...): names each key with the run's value and the new one.
    """
    saved_file = run_dir / reuse.SAVED_CONFIG
    if not saved_file.is_file():
        log.warning("%s has no saved config (%s): resuming with the command line's", run_dir, reuse.SAVED_CONFIG)
        return cfg
    bound, _ = reuse.reuse(cfg, run_dir, overrides, keep=RESUME_KEEPS)
    saved, after = _leaves(reuse.load_saved(run_dir)), _leaves(bound)
    refused, allowed = [], []
    for key in sorted(key for key in saved.keys() | after.keys() if saved.get(key) != after.get(key)):
        old, new = saved.get(key), after.get(key)
        raised = key == "trainer.epochs" and isinstance(new, int) and isinstance(old, int) and new >= old
        safe = raised or key in SAFE_KEYS or _is_under(key, SAFE_PREFIXES)
        (allowed if safe else refused).append(f"{key}: {_shown(old)!r} -> {_shown(new)!r}")
    if refused:
        raise ConfigError(
            f"resume={cfg.resume} continues {run_dir} with its own config ({saved_file}); the command line "
            f"changes the experiment: {'; '.join(refused)}. Drop these overrides, or start a new run"
        )
    for change in allowed:
        log.info("Resume with a changed setting (allowed): %s", change)
    return bound
