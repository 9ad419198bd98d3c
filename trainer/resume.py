"""Continue a killed or preempted run: find its folder, its backup, and trim its history to what is saved.

python run.py resume=outputs/2026-11-30/12-00-00     # or resume=latest
"""

from __future__ import annotations

import csv
import enum
import hashlib
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer import folders, run_config
from trainer.backup import read_state
from trainer.errors import ConfigError
from trainer.reports import write_atomic

log = logging.getLogger(__name__)


def resolve_resume(resume: str | None, output_dir: str) -> str:
    """The folder a run writes to: `resume` (an earlier run folder, or `latest`) or Hydra's new folder.

    With run.py, Hydra's folder already is the resumed one (`hydra.run.dir` follows `resume`).

    Raises:
        ConfigError: `resume` names no run folder.
    """
    if not resume:
        return output_dir
    picked = resume == "latest" and (Path(output_dir) / "backup").is_dir()  # Hydra's resolver picked it
    folder = output_dir if picked else folders.resume_folder(resume)
    if resume == "latest":
        log.info("resume=latest: continuing %s, the interrupted run whose backup was written last", folder)
    return folder


def backup_folder(run_dir: Path, output_dir: str, worker: str | None) -> Path:
    """Where the backup (trainer.backup) keeps this worker's state: the run folder for the chief (`worker=None`),
    else a temporary folder named after the run and the worker, so a rerun of that worker (with
    resume=PATH) finds it and two workers never share one."""
    if worker is None:
        return run_dir / "backup"
    key = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"vggtrain-backup-{key}-{worker}"


def prepare_resume(run_dir: Path, backup_dir: Path, resume: str | None) -> int:
    """Epochs already done per the backup; trims history.csv to exactly those, so none appears twice.

    A run killed before its first epoch ended has no backup: it starts again
    from epoch 1. A run whose epochs are all done but whose metrics.json is
    missing (killed in the test evaluation) still has its backup.

    Raises:
        ConfigError: `resume` points at a run that finished (it has its metrics.json), or at an unreadable backup.
    """
    if resume and (run_dir / "metrics.json").is_file():
        raise ConfigError(f"resume={resume}: the run finished (it has metrics.json); start a new run instead")
    state = read_state(backup_dir)
    done = state.epoch if state else 0
    history_csv = run_dir / "history.csv"
    if history_csv.is_file():
        lines = history_csv.read_text().splitlines(keepends=True)
        kept = lines[:1] + [line for line in lines[1:] if _epoch_of(line) <= done]
        if kept != lines:
            write_atomic(history_csv, lambda temporary: temporary.write_text("".join(kept)))
    if resume:
        if done:
            log.info("Resuming %s after epoch %d from %s <resume=%s>", run_dir, done, state.weights, resume)
        else:
            log.info("No epoch of %s was finished: training it from epoch 1 <resume=%s>", run_dir, resume)
    return done


def _epoch_of(line: str) -> int:
    """The epoch number of a history.csv row; a torn row (no number) counts as not done."""
    try:
        return int(line.split(",", 1)[0])
    except ValueError:
        return 1 << 30


def read_history(path: Path) -> dict[str, list[float]]:
    """history.csv as columns of floats: every epoch of the run, resumed parts included."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {name: [float(row[name]) for row in rows] for name in rows[0]} if rows else {}


# Keys a resumed run may change: they do not change what is being trained.
SAFE_KEYS = ("trainer.verbose", "trainer.threads", "trainer.save_every_steps", "dataset.data_dir")
SAFE_PREFIXES = (
    *("strategy.workers", "strategy.task_index", "strategy.cluster", "strategy.timeout_seconds"),
    *("name", "tags", "logger"),  # labels and trackers: what is trained stays the same
)
# Keys of this invocation, taken from the command line. Unlike evaluate (run_config.INVOCATION_KEYS), a
# resumed run keeps its strategy: another replica count changes the experiment.
RESUME_KEEPS = tuple(key for key in run_config.INVOCATION_KEYS if key != "strategy")


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
    `trainer.run_config`), plus the command line's overrides of keys that are safe to change
    (logged); `cfg` itself if the run saved no config.

    Raises:
        ConfigError: the command line changes the experiment (dataset, model, optimizer, batch size,
            seed, precision, strategy, fewer epochs...): names each key with the run's value and the new one.
    """
    saved_file = run_dir / run_config.SAVED_CONFIG
    if not saved_file.is_file():
        log.warning("%s has no saved config (%s): resuming with the command line's", run_dir, run_config.SAVED_CONFIG)
        return cfg
    bound, _ = run_config.reuse(cfg, run_dir, overrides, keep=RESUME_KEEPS)
    saved, after = _leaves(run_config.load_saved(run_dir)), _leaves(bound)
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
