"""Step 3 of training: hold the run folder while the phases fit. Its lock, the trackers' runs, what a killed
process left removed, the backup read, the data bound to the run, and every worker agreeing on what is done.

    python run.py                                   # a new run folder under outputs/
    python run.py resume=outputs/2026-12-07/05-30-00   # the same folder, held again, from its last saved epoch

`trainer.tasks.train` plans the run and builds the model first; `trainer.tasks.phases` fits inside the folder.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf

from trainer.config.schema import Config
from trainer.distribute.agreement import chief_numbers
from trainer.distribute.failures import collective_errors
from trainer.errors import ConfigError, DiskError
from trainer.runs import locks, storage
from trainer.runs.atomic import remove_temporaries, write_atomic
from trainer.runs.backup import ENDINGS, read_state
from trainer.runs.digest import DigestGate, FileDigests
from trainer.runs.resume import CHIEF_RUN, DATA_FILE, Progress, bind_data, prepare_resume
from trainer.tasks.plan import Folder, Plan
from trainer.tasks.runtime import run_folder
from trainer.tracking import loggers
from trainer.tracking.sweep import sweep_folder

log = logging.getLogger(__name__)


def sweep_job_folder() -> Path | None:
    """The sweep folder when Hydra runs this job as part of a multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    return sweep_folder(Path(hydra.runtime.output_dir), hydra.sweep)


SWEEP_SYNTAX = ("range(", "choice(", "interval(", "glob(", "shuffle(", "sort(", "tag(")


def _job_name() -> str | None:
    """A multirun job's name for the trackers: its number and the values of the swept keys (`3: optimizer.lr=0.01
    model.dropout=0.5`), not just the folder's number; None outside a multirun."""
    if sweep_job_folder() is None:
        return None
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra = HydraConfig.get()
    swept = set(hydra.sweeper.get("params") or {})  # Optuna's search space, a sweeper's params
    for argument in sys.argv[1:]:  # the command line's grids, where this process launched the sweep
        key, _, value = argument.lstrip("+~").partition("=")
        if not value.startswith(("[", "{")) and ("," in value or value.startswith(SWEEP_SYNTAX)):
            swept.add(key)
    task = OmegaConf.to_container(hydra.overrides.task, resolve=False)  # as typed: `${...}` left unresolved
    chosen = [item for item in task if item.lstrip("+~").partition("=")[0] in swept]
    chosen = chosen or [item for item in task if "/" not in item and not item.startswith("hydra.")]
    return f"{hydra.job.num}: {' '.join(chosen)}" if chosen else str(hydra.job.num)


@contextlib.contextmanager
def open_run_folder(settings: Config, plan: Plan, config_tree: str | None = None) -> Iterator[Folder]:
    """Holds the run folder while the body trains: its lock (the chief's), the trackers' runs, the errors
    of collectives and of bad records as one line; reads what the backup says is done already. A resume's
    `config_tree` (the printed config) is saved once the run is bound to this data, not by a refused resume.

    Raises:
        RunLocked: another process holds the folder.
        ConfigError: the run finished already, or has more epochs done than `trainer.epochs`.
        DiskError: a file of the run folder could not be written; it says how to resume.
    """
    run_name, tags = settings.name or _job_name() or Path(plan.output_dir).name, list(settings.tags)
    log.info("Run %s, tags [%s] <name=%s tags=%s>", run_name, ", ".join(tags), settings.name, tags)
    params = {key: value for key, value in loggers.flatten(settings).items() if key != "output_dir"}
    with (
        run_folder(plan.output_dir, plan.chief) as run_dir,
        locks.hold(run_dir) if plan.chief else contextlib.nullcontext({}) as invocation,  # one writer per folder
        collective_errors(plan.strategy, lambda: _resume_hint(run_dir, plan.chief, settings.trainer.epochs)),
        plan.data.named_bad_records(),
        loggers.tracking(plan.trackers, run_dir, run_name, tags, params, sweep_job_folder()),
    ):
        try:
            progress, gate = _take_over(settings, plan, run_dir)
            if config_tree is not None and plan.chief:
                write_atomic(run_dir / "config_tree.txt", lambda temporary: temporary.write_text(config_tree))
            done, steps, ended = progress
            yield Folder(run_dir, run_dir / "backup", done, ended, invocation, run_name, tags, gate, steps)
        except DiskError as error:  # set-up, training or the test evaluation: what is written is consistent
            hint = f"Free space or fix permissions, then continue with: python run.py resume={run_dir}"
            raise DiskError(f"{error}. {hint}") from None


def _take_over(settings: Config, plan: Plan, run_dir: Path) -> tuple[Progress, DigestGate | None]:
    """(what the backup holds, the data's digest gate) of the folder this process now holds: what a
    killed process left is removed, the backup read, the data bound to the run.

    Raises:
        ConfigError: the run has more epochs done than `trainer.epochs`.
    """
    for folder in (run_dir, run_dir / "checkpoints"):
        remove_temporaries(folder)  # left by a killed process; this one holds the folder
    if plan.chief and settings.resume and plan.outputs.checkpoints:  # the folder lost its backup: the copy's
        storage.restore_mirror(storage.join(plan.outputs.checkpoints, "backup"), run_dir / "backup")
    # Another worker's folder is new on each start: what is done is the chief's to say.
    progress = prepare_resume(run_dir, run_dir / "backup", settings.resume) if plan.chief else Progress()
    progress = agree_on_progress(plan.strategy, progress)
    done = progress.done
    if settings.resume and not plan.chief:
        log.info("The chief's backup holds %d finished epoch(s): training goes on from there", done)
    gate = None
    if plan.chief:
        if settings.resume:  # a refused resume must leave data.json as the run trained it: check before binding
            plan.late_checks.run()
        bind_data(run_dir, plan.data.fingerprint, settings.resume, settings.allow_data_change, done)
    if plan.chief and plan.data.files:  # a part of no files (records made in memory) has none to hash
        gate = DigestGate(
            FileDigests(plan.data.files), run_dir / DATA_FILE, settings.resume, settings.allow_data_change
        )
    if done > settings.trainer.epochs:
        raise ConfigError(f"resume={settings.resume}: {done} epochs are done already; raise trainer.epochs")
    return progress, gate


def _resume_hint(run_dir: Path, chief: bool, epochs: int) -> str:
    """What a lost worker leaves saved, and the resume every worker needs (`resume=` the chief's folder)."""
    try:
        state = read_state(run_dir / "backup")
    except ConfigError:
        state = None
    done = state.epoch if state else 0
    saved = (
        f"all {epochs} epochs are saved" if done >= epochs
        else f"epoch {done + 1} did not finish, epoch {done} is the last saved" if done
        else "no epoch was saved yet"
    )  # fmt: skip
    folder = run_dir if chief else CHIEF_RUN
    return f"{saved}; restart every worker with resume={folder}"


def agree_on_progress(strategy: tf.distribute.Strategy, progress: Progress) -> Progress:
    """The chief's progress (epochs done, steps of the next, why training ended) on every worker: only the
    chief's backup survives a restart (each other worker starts in a fresh temporary folder)."""
    endings = ("", *ENDINGS)
    done, steps, ending = chief_numbers(strategy, [progress.done, progress.steps, endings.index(progress.ended)])
    return Progress(done, steps, endings[ending])
