"""Run folders that never collide: a new folder per run (even in the same second), found again by `resume=`.

    python run.py                    # outputs/DATE/TIME, or outputs/DATE/TIME-2 if that one is taken
    python run.py resume=RUN         # writes into RUN again (resume=latest: the run backed up last)

These functions name Hydra's folders (`hydra.run.dir`, `hydra.sweep.dir`, through the
resolvers of `trainer.config.resolvers`); `trainer.runs.locks` keeps one writer per folder.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainer.errors import ConfigError

log = logging.getLogger(__name__)

_claimed: dict[str, str] = {}


def claim_new_folder(path: str) -> str:
    """Creates and returns `path`, or `path-2`, `path-3`... if taken: the mkdir is the claim, so two
    processes started in the same second (even on two hosts sharing the disk) never get one folder.
    Same answer for the same `path` within a process (Hydra resolves its folder more than once)."""
    if path not in _claimed:
        base = Path(path)
        base.parent.mkdir(parents=True, exist_ok=True)
        candidate, number = base, 1
        while True:
            try:
                candidate.mkdir()
                break
            except FileExistsError:
                number += 1
                candidate = base.with_name(f"{base.name}-{number}")
        _claimed[path] = str(candidate)
    return _claimed[path]


def is_run_folder(path: Path) -> bool:
    """Whether `path` was made by a training run (its saved config, history or backup is there)."""
    return any((path / name).exists() for name in (".hydra/config.yaml", "history.csv", "backup"))


def latest_interrupted(root: Path = Path("outputs")) -> Path:
    """The run under `root` whose backup was written most recently (not the folder made first).

    Raises:
        ConfigError: no run under `root` has a backup.
    """
    backups = [path for path in root.glob("**/backup/training_metadata.json") if path.is_file()]
    if not backups:
        raise ConfigError(f"resume=latest: no run folder under {root}/ has a backup to resume from")
    return max(backups, key=lambda path: path.stat().st_mtime).parent.parent


def resume_folder(resume: str) -> str:
    """The run folder `resume` names (`latest`: the most recently backed-up interrupted run).

    Raises:
        ConfigError: `resume` names no training run folder.
    """
    if resume == "latest":
        return str(latest_interrupted())
    if not Path(resume).is_dir() or not is_run_folder(Path(resume)):
        raise ConfigError(f"resume={resume}: not a training run folder (no .hydra/config.yaml, history.csv or backup/)")
    return resume


def check_resume_argument(arguments: list[str]) -> None:
    """Checks a `resume=` command-line override before Hydra resolves its folder from it (an error
    raised inside Hydra's resolver would print a traceback instead of one line).

    Raises:
        ConfigError: `resume` names no training run folder.
    """
    for argument in arguments:
        if argument.startswith(("resume=", "+resume=", "++resume=")):
            value = argument.split("=", 1)[1].strip("'\"")
            if value and value != "null":
                resume_folder(value)


def hydra_subdir(resume: str | None) -> str | None:
    """`hydra.output_subdir`: `.hydra` for a new run; none for a resumed one, whose `.hydra/` stays the original."""
    return None if resume else ".hydra"
