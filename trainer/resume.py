"""Continue a killed or preempted run: find its folder, its backup, and trim its history to what is saved.

python run.py resume=outputs/2026-11-30/12-00-00     # or resume=latest
"""

from __future__ import annotations

import csv
import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer import folders
from trainer.backup import read_state
from trainer.errors import ConfigError
from trainer.reports import write_atomic

log = logging.getLogger(__name__)

CONF = Path(__file__).resolve().parents[1] / "conf"  # the config tree run.py composes


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
    """Where BackupAndRestore keeps this worker's state: the run folder for the chief (`worker=None`),
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
SAFE_PREFIXES = ("strategy.workers", "strategy.task_index", "strategy.cluster", "strategy.timeout_seconds")
NOT_TRAINING = ("evaluate", "predict", "inspect", "export", "checkpoint", "mode", "resume", "output_dir")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def _leaves(cfg: DictConfig) -> dict[str, Any]:
    flat = _flatten(OmegaConf.to_container(cfg, resolve=False))
    return {key: value for key, value in flat.items() if key.split(".")[0] not in NOT_TRAINING + ("hydra",)}


def _training_overrides(overrides: list[str]) -> list[str]:
    """The overrides that shape the experiment: not hydra.*, resume, output_dir or mode."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [
        text
        for text, override in zip(overrides, parsed, strict=True)
        if not override.key_or_group.startswith("hydra") and override.key_or_group not in NOT_TRAINING
    ]


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside run.py's hydra.main
        return compose("config", overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def bind_to_run(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> DictConfig:
    """The config a resumed run trains with: the run's own (`RUN/.hydra/config.yaml`), plus the
    command line's overrides of keys that are safe to change (logged); `cfg` unchanged if the run
    saved no config.

    Raises:
        ConfigError: the command line changes the experiment (dataset, model, optimizer, batch size,
            seed, precision, strategy...): names each key with the run's value and the new one.
    """
    saved_file = run_dir / ".hydra" / "config.yaml"
    if not saved_file.is_file():
        log.warning("%s has no saved config (.hydra/config.yaml): resuming with the command line's", run_dir)
        return cfg
    saved_overrides = _training_overrides(list(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")))
    before = _leaves(_compose(saved_overrides))
    bound = _compose(saved_overrides + _training_overrides(overrides))
    after, saved = _leaves(bound), _leaves(OmegaConf.load(saved_file))
    changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
    refused, allowed = [], []
    for key in changed:
        old, new = saved.get(key, before.get(key)), after.get(key)
        raised = key == "trainer.epochs" and isinstance(new, int) and isinstance(old, int) and new >= old
        safe = raised or key in SAFE_KEYS or key.startswith(SAFE_PREFIXES)
        (allowed if safe else refused).append(f"{key}: {old!r} -> {new!r}")
    if refused:
        raise ConfigError(
            f"resume={cfg.resume} continues {run_dir} with its own config ({saved_file}); the command line "
            f"changes the experiment: {'; '.join(refused)}. Drop these overrides, or start a new run"
        )
    for change in allowed:
        log.info("Resume with a changed setting (allowed): %s", change)
    for key, value in saved.items():  # the run's values win over conf/ files edited since
        if key in after and key not in changed and after[key] != value:
            OmegaConf.update(bound, key, value, merge=False)
    bound.output_dir, bound.resume, bound.mode = cfg.output_dir, cfg.resume, "train"
    return bound
