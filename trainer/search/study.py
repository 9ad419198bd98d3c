"""A search's study: where it is stored, whether this search may continue it, how many trials it still needs,
and the trials a dead sweep left running.

    hydra.sweeper.storage=null                       # study.journal in the sweep folder (Optuna's JournalStorage)
    hydra.sweeper.storage=/shared/searches/vgg.journal    # a journal file that several machines share (NFS)
    hydra.sweeper.storage=postgresql://user@db/optuna     # any database URL Optuna's RDBStorage opens

Several sweeps may run one study at once (two shells, Slurm array tasks): each asks for
trials only while the study holds fewer than `n_trials`, and a trial asked past that (two
sweeps asked at the same moment) is failed at once, marked surplus and not counted. So
together they run exactly `n_trials`.

Each sweep beats a heartbeat into the trials it runs. A RUNNING trial whose sweep died
(its process is gone from this machine, or its heartbeat is older than the grace period)
is marked failed and, up to `retries` times, enqueued again with the same parameters.
A trial stopped by Ctrl-C or SIGTERM (`interrupt`) stops its sweep; it is marked failed and interrupted and
enqueued again at once, whatever `retries`, so the same command runs it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

OWNER = "vggtrain:owner"  # the sweep that runs the trial: host:pid:token
HEARTBEAT = "vggtrain:heartbeat"  # when that sweep last said it is alive (time.time())
RETRY_OF = "vggtrain:retry_of"  # an enqueued retry: the number of the trial it repeats
KILLED = "vggtrain:killed"  # a trial whose sweep died while it ran
INTERRUPTED = "vggtrain:interrupted"  # a trial that Ctrl-C or SIGTERM stopped: run again by the same command
PRUNED_ON = "vggtrain:pruned_on"  # the metric the study's pruner is told each epoch (objective.prune_metric)
SURPLUS = "vggtrain:surplus"  # asked past n_trials by a sweep sharing the study: failed at once, not counted
RUN_DIRS = "vggtrain:run_dirs"  # the trial's run folders (one, or one per fold), as the sweep's launcher gave them
OUTCOME = "vggtrain:outcome"  # written by the trial's job: {"state": complete|pruned, "metrics": metrics.json}


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage a search uses, as its jobs are told: a database URL as given, a journal file's absolute path."""
    if storage and "://" in storage:
        return storage
    return str(Path(storage).expanduser().resolve() if storage else (sweep_dir / "study.journal").resolve())


def open_storage(url: str) -> Any:
    """Optuna's storage for `storage_url`'s answer: a database through RDBStorage, else a JournalStorage file.

    Raises:
        ConfigError: it cannot be opened (`hydra.sweeper.storage` named, with the reason).
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend

    logging.getLogger("alembic").setLevel(logging.WARNING)  # a database's schema set-up: 7 INFO lines otherwise
    try:
        if "://" in url:
            return optuna.storages.RDBStorage(url)
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(url))
    except Exception as error:  # SQLAlchemy's and the file system's many kinds
        reason = " ".join(str(error).split())[:300]
        raise ConfigError(f"hydra.sweeper.storage: cannot open '{url}': {reason}") from None


def open_study(name: str, storage: Any, directions: list[str], sampler: Any, pruner: Any) -> Any:
    """Study `name`, created or continued; a study of other directions is refused.

    Raises:
        ConfigError: the stored study optimises in other directions.
    """
    import optuna

    study = optuna.create_study(
        study_name=name, storage=storage, sampler=sampler, pruner=pruner, directions=directions, load_if_exists=True
    )
    stored = [direction.name.lower() for direction in study.directions]
    if stored != directions:
        raise ConfigError(
            f"hydra.sweeper.study_name: study '{name}' is stored with direction {stored}, and this search has "
            f"{directions}; give this search another study_name (or storage)"
        )
    return study


def check_space(study: Any, name: str, distributions: dict[str, Any]) -> None:
    """Refuses to continue a study over another search space: other keys, or other ranges of the same keys.

    Raises:
        ConfigError: naming the first difference.
    """
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        if not trial.distributions or trial.user_attrs.get(SURPLUS):
            continue
        stored = trial.distributions
        for key in sorted(set(stored) | set(distributions)):
            if stored.get(key) != distributions.get(key):
                raise ConfigError(
                    f"hydra.sweeper.study_name: study '{name}' searched {key} over {_shown(stored.get(key))}, and "
                    f"this search over {_shown(distributions.get(key))}; give this search another study_name"
                )
        return


def check_pruned_on(study: Any, name: str, pruned_on: str, objective: str) -> None:
    """Refuses to continue a study whose pruner was told another metric each epoch (its rungs would compare
    `val_accuracy` with `accuracy`), and records the metric in a study that has none. A study from before
    `objective.prune_metric` was told the objective's metric.

    Raises:
        ConfigError: naming both metrics.
    """
    reported = any(trial.intermediate_values for trial in study.get_trials(deepcopy=False))
    stored = study.user_attrs.get(PRUNED_ON) or (objective if reported else None)
    if stored is not None and stored != pruned_on:
        raise ConfigError(
            f"hydra.sweeper.study_name: study '{name}' told its pruner {stored} each epoch, and this search would "
            f"tell it {pruned_on} (objective.prune_metric): its rungs would compare the two; give this search "
            f"another study_name, or set objective.prune_metric={stored}"
        )
    if PRUNED_ON not in study.user_attrs:
        study.set_user_attr(PRUNED_ON, pruned_on)


def _shown(distribution: Any) -> str:
    if distribution is None:
        return "nothing (not searched)"
    from optuna.distributions import distribution_to_json

    return distribution_to_json(distribution)


def counted(trials: list[Any]) -> list[Any]:
    """The trials that count towards `n_trials`: all but surplus ones and failed ones that a retry replaces."""
    retried = {trial.user_attrs.get(RETRY_OF) for trial in trials}
    return [trial for trial in trials if not trial.user_attrs.get(SURPLUS) and trial.number not in retried]


class Owner:
    """This sweep process, as it marks the trials it runs."""

    def __init__(self) -> None:
        self.host, self.pid, self.token = socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8]
        self.mark = f"{self.host}:{self.pid}:{self.token}"

    def claim(self, trial: Any) -> None:
        """Marks an asked trial (an `optuna.Trial`) as this sweep's."""
        trial.set_user_attr(OWNER, self.mark)
        trial.set_user_attr(HEARTBEAT, time.time())

    def is_dead(self, trial: Any, grace_seconds: float) -> bool:
        """Whether the sweep that runs `trial` (RUNNING) is gone: a process of this machine that no longer
        exists, or no heartbeat for `grace_seconds`."""
        mark = str(trial.user_attrs.get(OWNER, ""))
        if mark == self.mark:
            return False
        host, _, rest = mark.partition(":")
        pid = rest.partition(":")[0]
        if host == self.host and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # alive, another user's
                pass
        beat = trial.user_attrs.get(HEARTBEAT)
        if beat is None:
            beat = trial.datetime_start.timestamp() if trial.datetime_start else time.time()
        return time.time() - float(beat) > grace_seconds


def killed_key(number: int) -> str:
    """The study attribute that marks trial `number` killed (a trial of another sweep takes no attribute through
    Optuna's public API: `study.set_user_attr` marks it)."""
    return f"{KILLED}:{number}"


def was_killed(trial: Any, study_attrs: dict[str, Any]) -> bool:
    """Whether a trial was running when its sweep died (marked on the study; studies of earlier versions marked
    the trial itself)."""
    return bool(study_attrs.get(killed_key(trial.number)) or trial.user_attrs.get(KILLED))


def fail_dead_trials(study: Any, owner: Owner, grace_seconds: float, retries: int, log: Any) -> None:
    """Marks failed the RUNNING trials whose sweep died, and enqueues each again (same parameters) while it has
    been run fewer than `retries` + 1 times. Two sweeps doing this at once fail and retry each trial once."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    by_number = {trial.number: trial for trial in trials}
    for trial in trials:
        if trial.state != TrialState.RUNNING or not owner.is_dead(trial, grace_seconds):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # another sweep got there first (UpdateFinishedTrialError is one)
            continue
        study.set_user_attr(killed_key(trial.number), True)
        runs, earlier = 1, trial.user_attrs.get(RETRY_OF)
        while earlier is not None and earlier in by_number:  # an interrupted run is no failure: not counted
            runs += not by_number[earlier].user_attrs.get(INTERRUPTED)
            earlier = by_number[earlier].user_attrs.get(RETRY_OF)
        if runs <= retries:
            study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number}, skip_if_exists=False)
            log.warning("Trial %d was running when its sweep died: failed, and run again", trial.number)
        else:
            log.warning("Trial %d was running when its sweep died: failed (hydra.sweeper.retries=%d)", trial.number,
                        retries)  # fmt: skip


def interrupt(study: Any, trials: list[Any], log: Any) -> list[int]:
    """Marks failed and interrupted the `trials` still running (their jobs were stopped by Ctrl-C or SIGTERM) and
    enqueues each again with the same parameters, so the same command runs it again.

    Returns:
        The numbers of the trials marked.
    """
    from optuna.trial import TrialState

    marked = []
    for trial in trials:
        if frozen(study, trial.number).state != TrialState.RUNNING:
            continue  # finished before the stop
        try:
            trial.set_user_attr(INTERRUPTED, True)
            study.tell(trial, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # finished meanwhile (UpdateFinishedTrialError is a RuntimeError)
            continue
        study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number}, skip_if_exists=False)
        log.warning("Trial %d was stopped: the same command runs it again", trial.number)
        marked.append(trial.number)
    return marked


def frozen(study: Any, number: int) -> Any:
    """Trial `number` of the study as stored now (what its jobs wrote included): an asked `optuna.Trial` keeps
    the attributes of when it was asked."""
    return next(trial for trial in study.get_trials(deepcopy=False) if trial.number == number)


def within_budget(study: Any, asked: list[Any], n_trials: int) -> list[Any]:
    """The `asked` trials that fit in `n_trials`, by trial number; the others (another sweep asked at the same
    moment) are failed at once and marked surplus."""
    from optuna.trial import TrialState

    ranks = {trial.number: rank for rank, trial in enumerate(counted(study.get_trials(deepcopy=False)))}
    kept = []
    for trial in asked:
        if ranks.get(trial.number, n_trials) < n_trials:
            kept.append(trial)
        else:
            trial.set_user_attr(SURPLUS, True)
            study.tell(trial, state=TrialState.FAIL)
    return kept


@contextlib.contextmanager
def heartbeat(trials: list[Any], seconds: float) -> Iterator[None]:
    """Beats every `seconds` into `trials` while the block runs (their jobs), so that other sweeps see them alive."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(seconds):
            for trial in trials:
                with contextlib.suppress(Exception):  # a finished trial takes no attribute: nothing to keep alive
                    trial.set_user_attr(HEARTBEAT, time.time())

    thread = threading.Thread(target=beat, name="search-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
