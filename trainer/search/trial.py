"""The job's side of a search: the Optuna trial this run is (`trial.*`, set by the vggtrain_optuna sweeper).

    python run.py -m hparams_search=vgg19_optuna hydra.sweeper.pruner._target_=optuna.pruners.MedianPruner

With a pruner, `PruneCallback` reports `objective.prune_metric` (else `objective.metric`) at every epoch end
and stops training after the epoch the pruner condemns; the run folder is complete
(history up to there, the test evaluation, `pruned: true` in metrics.json). At the end the
run's outcome and metrics go into the trial (`OUTCOME`), where the sweep reads them: jobs
on other machines (Slurm) share nothing with the sweep but the study's storage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import keras

from trainer.search.study import OUTCOME, open_storage
from trainer.targets import build_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyTrial:
    """The Optuna trial a job is: what the sweeper sets in `trial.*` (the task layer hands it over)."""

    number: int | None = None  # None outside a search
    study: str | None = None  # the study's name
    storage: str | None = None  # the study's storage: a journal file or a database URL
    pruner: dict[str, Any] | None = None  # the study's pruner ({_target_: optuna.pruners.MedianPruner, ...})


def connect(config: StudyTrial) -> Any | None:
    """The Optuna trial of this job (its study loaded with the sweep's pruner); None outside a search."""
    if config.number is None:
        return None
    import optuna

    pruner = None
    if config.pruner:
        options = dict(config.pruner)
        pruner = build_target("hydra.sweeper.pruner", options.pop("_target_", None), options)

    storage = open_storage(config.storage)
    study = optuna.load_study(study_name=config.study, storage=storage, pruner=pruner)
    # Optuna has no public call that opens a running trial of another process: its id comes from the storage we
    # opened (BaseStorage: "not supposed to be directly accessed by library users") and optuna.Trial's own
    # constructor ("direct use is not recommended") makes it (docs/development.md, the ledger's Optuna row).
    study_id = storage.get_study_id_from_name(config.study)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, config.number)
    return optuna.Trial(study, trial_id)


class PruneCallback(keras.callbacks.Callback):
    """Reports `metric` to the trial after every epoch; stops training when the study's pruner says so."""

    def __init__(self, trial: Any, metric: str) -> None:
        super().__init__()
        self.trial, self.metric, self.pruned_after = trial, metric, None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        value = (logs or {}).get(self.metric)
        if value is None:
            return
        self.trial.report(float(value), epoch)
        if self.trial.should_prune():
            self.pruned_after = epoch + 1
            self.model.stop_training = True
            log.info("Pruned after epoch %d: the study's pruner stops this trial (%s %.4f)", epoch + 1, self.metric,
                     float(value))  # fmt: skip


def pruning_callbacks(config: StudyTrial, metric: str, chief: bool) -> list[keras.callbacks.Callback]:
    """[PruneCallback] when this job is a trial of a search with a pruner (on the chief), else []."""
    if config.number is None or not config.pruner or not chief:
        return []
    return [PruneCallback(connect(config), metric)]


def pruned(callbacks: list[keras.callbacks.Callback]) -> bool:
    return any(isinstance(item, PruneCallback) and item.pruned_after for item in callbacks)


def outcome_key(fold: int | None) -> str:
    """The trial attribute a job's outcome goes to: one per fold when a trial runs several (cross-validation)."""
    return OUTCOME if fold is None else f"{OUTCOME}:fold{fold}"


def record_interrupted(config: StudyTrial, fold: int | None = None) -> None:
    """Notes in its trial that Ctrl-C or SIGTERM stopped this job, for a sweep that launched it in another process
    (joblib, Slurm) and gets its exception as a failure: the sweep stops and runs the trial again next time."""
    trial = connect(config)
    if trial is not None:
        trial.set_user_attr(outcome_key(fold), {"state": "interrupted"})


def record_outcome(config: StudyTrial, metrics: dict[str, Any], fold: int | None = None) -> None:
    """Writes the run's outcome (`pruned` or `complete`) and its metrics into its trial, for the sweep (`fold`:
    the fold this job validates on, when the trial is cross-validated)."""
    trial = connect(config)
    if trial is None:
        return
    shown = {key: value for key, value in metrics.items() if isinstance(value, (int, float, str, bool, type(None)))}
    state = "pruned" if metrics.get("pruned") else "complete"
    trial.set_user_attr(outcome_key(fold), {"state": state, "metrics": shown})
