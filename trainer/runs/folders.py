"""Run folders that never collide: a new folder per run (even in the same second), found again by `resume=`.

    python run.py                    # outputs/DATE/TIME, or outputs/DATE/TIME-2 if that one is taken
    python run.py resume=RUN         # writes into RUN again (resume=latest: the run backed up last)

These functions name Hydra's folders (`hydra.run.dir`, `hydra.sweep.dir`, through the
resolvers of `trainer.config.resolvers`); `trainer.runs.locks` keeps one writer per folder.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from trainer.distribute import cluster
from trainer.errors import ConfigError, DiskError
from trainer.runs import locks

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
    """The run under `root` whose backup was written most recently (not the folder made first), among those no
    live process is writing (a training run holds its lock).

    Raises:
        ConfigError: no run under `root` has a backup, or every one that has is training now.
    """
    backups = [path for path in root.glob("**/backup/training_metadata.json") if path.is_file()]
    if not backups:
        raise ConfigError(f"resume=latest: no run folder under {root}/ has a backup to resume from")
    runs = [path.parent.parent for path in sorted(backups, key=lambda path: path.stat().st_mtime, reverse=True)]
    idle = [run for run in runs if locks.is_claimed(run) or not locks.is_held(run)]  # claimed: by this command
    if not idle:
        raise ConfigError(f"resume=latest: every run under {root}/ with a backup is training now ({runs[0]}, ...)")
    if idle[0] != runs[0]:
        log.info(
            "resume=latest: skipping %s, which a live process is training",
            ", ".join(map(str, runs[: runs.index(idle[0])])),
        )
    return idle[0]


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


def check_resume_argument(arguments: list[str], multirun: bool = False) -> None:
    """Checks a `resume=` command-line override before Hydra resolves its folder from it (an error
    raised inside Hydra's resolver would print a traceback instead of one line), and locks that folder
    (`locks.claim`) before Hydra logs into it and the run reads its data: a second resume of a folder in use is
    refused at once and writes nothing there. Only the chief locks it, and not for a sweep (`multirun`: the
    config's hydra.mode, or -m): its jobs lock the folder they train in, maybe in processes of their own.

    Raises:
        ConfigError: `resume` names no training run folder, or one that finished (checked here too: Hydra
            would first append its log lines to the finished run's run.log).
        RunLocked: another live process holds the folder.
    """
    for argument in arguments:
        if argument.startswith(("resume=", "+resume=", "++resume=")):
            value = argument.split("=", 1)[1].strip("'\"")
            if value and value != "null":
                _check_resume_mode(value, _argument(arguments, "mode"))
                folder = Path(resume_folder(value))
                swept = "-m" in arguments or "--multirun" in arguments
                if (folder / "metrics.json").is_file() and not swept:
                    raise ConfigError(
                        f"resume={value}: the run finished (it has metrics.json); to train on from its weights, "
                        f"start a new run with model.init_from={folder} (its own folder, config and schedule, "
                        f"e.g. trainer.epochs=20)"
                    )
                chief = cluster.may_be_chief(_argument(arguments, "strategy.task_index"))
                if chief and not (multirun or swept):  # the other workers train in temporary folders
                    locks.claim(folder)
                    _resumed.add(folder.resolve())


def _check_resume_mode(value: str, mode: str | None) -> None:
    """`resume=` continues training; another mode would write its files into the training run's folder (mode=inspect
    replaced its config_tree.txt) or fail on a missing checkpoint.

    Raises:
        ConfigError: the one line, with the command the user meant.
    """
    if mode in (None, "train"):
        return
    if mode in ("evaluate", "predict", "export"):
        meant = f"for the run's checkpoint: python run.py mode={mode} checkpoint={value}"
    else:
        meant = f"leave resume= out of mode={mode}"
    raise ConfigError(f"resume={value} continues training (mode=train), not mode={mode}; {meant}")


_resumed: set[Path] = set()  # folders claimed to resume a run: released, never removed


def release_claimed_folders() -> None:
    """Lets go of the early locks (`locks.claim`) no training took over; a new folder that holds nothing else
    (Hydra refused an override before the run started) goes too, a resumed run's folder stays."""
    for folder in locks.release_claims():
        if folder.resolve() not in _resumed:
            remove_if_unused(folder)
    _resumed.clear()


TRAINING_FILES = ("history.csv", "backup", "checkpoints", "metrics.json")  # a folder with any of them holds a run


def _holds(path: Path) -> bool:
    """Whether a run's file is there (a folder counts once it holds something: an empty `checkpoints/` made
    ahead of the run holds no run)."""
    if path.is_dir():
        return any(path.iterdir())
    return path.exists()


def _argument(arguments: list[str], key: str) -> str | None:
    for argument in arguments:
        name, _, value = argument.lstrip("+").partition("=")
        if name == key:
            value = value.strip("'\"")
            return None if value in ("", "null") else value
    return None


def check_run_dir_argument(arguments: list[str]) -> None:
    """Checks a `hydra.run.dir=` command-line override before Hydra writes `.hydra/` into it: a folder that holds
    a training run is never reused (Hydra would rewrite the run's saved config, and the new run its results),
    and `resume=RUN` writes into RUN itself.

    Raises:
        ConfigError: one line naming the folder, before anything is written.
    """
    if "-m" in arguments or "--multirun" in arguments:
        return  # jobs get their own folders under hydra.sweep.dir
    run_dir, resume = _argument(arguments, "hydra.run.dir"), _argument(arguments, "resume")
    if run_dir is None or "${" in run_dir:
        return  # an interpolation (Hydra resolves it): not a folder this check can name
    if resume is not None:
        raise ConfigError(
            f"resume={resume} writes into the resumed run's own folder; drop hydra.run.dir={run_dir} "
            f"(it would split the run between two folders)"
        )
    if not cluster.may_be_chief(_argument(arguments, "strategy.task_index")):
        return  # another task of a cluster, which may share the chief's folder: the chief writes it
    if locks.is_held(Path(run_dir)):
        raise _in_use(run_dir)
    found = [name for name in TRAINING_FILES if _holds(Path(run_dir) / name)]
    if found:
        raise ConfigError(
            f"hydra.run.dir={run_dir} holds a training run already ({', '.join(found)}): a new run never reuses "
            f"its folder. Choose a new folder, or continue that run with resume={run_dir}"
        )
    try:  # locked before Hydra writes into it: a run still starting up (no lock of its own yet) is safe too
        locks.claim(Path(run_dir))
    except locks.RunLocked:  # taken since is_held looked
        raise _in_use(run_dir) from None


def _in_use(run_dir: str) -> ConfigError:
    return ConfigError(
        f"hydra.run.dir={run_dir} is in use by a running training (its {locks.LOCK} is held): a new run never "
        f"reuses its folder. Choose a new folder"
    )


# what Hydra, the config printout and the early lock (`locks.claim`) write into any run folder
BOOKKEEPING = {".hydra", "run.log", "config_tree.txt", locks.LOCK}


def remove_if_unused(folder: Path) -> bool:
    """Deletes `folder` when it holds nothing but Hydra's bookkeeping: a command that failed before it started,
    or an export or prediction that wrote its results elsewhere, leaves no folder behind. Returns whether it did."""
    try:
        names = {path.name for path in folder.iterdir()}
    except OSError:
        return False
    if not names <= BOOKKEEPING:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def check_writable_output(arguments: list[str]) -> None:
    """Checks that the folder Hydra will create the run (or sweep) folder in can be written, before Hydra
    tries: its failure inside a resolver is a traceback.

    Raises:
        DiskError: one line naming the folder and the key that moves it.
    """
    sweep = "-m" in arguments or "--multirun" in arguments
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    target = Path(_argument(arguments, key) or "outputs")
    if not sweep and _argument(arguments, "resume"):
        return  # the resumed run's own folder, checked by resume_folder
    existing = next((folder for folder in [target, *target.parents] if folder.exists()), Path("."))
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return
    try:  # os.access misses a read-only file system for root: try what Hydra will do
        probe = existing / f".vggtrain-write-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        raise DiskError(
            f"cannot create the run folder in {existing.resolve()} ({error.strerror}); set {key}=A_WRITABLE_FOLDER"
        ) from None


def hydra_subdir(resume: str | None) -> str | None:
    """`hydra.output_subdir`: `.hydra` for a new run; none for a resumed one, whose `.hydra/` stays the original."""
    return None if resume else ".hydra"
