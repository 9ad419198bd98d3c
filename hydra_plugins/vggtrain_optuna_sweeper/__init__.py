"""Registers `hydra/sweeper=vggtrain_optuna` (Hydra finds plugins in the `hydra_plugins` namespace package).

The sweeper is `trainer.search.sweeper.OptunaSearch`; Hydra instantiates plugins defined in this package only,
hence the subclass here. Hydra imports every plugin module at start-up: Optuna is imported when a search runs.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from trainer.search import sweeper


class VggtrainOptunaSweeper(sweeper.OptunaSearch):
    """`hydra/sweeper=vggtrain_optuna` (see trainer.search.sweeper)."""


@dataclass
class VggtrainOptunaConf:
    _target_: str = "hydra_plugins.vggtrain_optuna_sweeper.VggtrainOptunaSweeper"
    _recursive_: bool = False  # the sweeper makes its sampler and pruner: a bad _target_ is one line, not Hydra's
    direction: Any = "maximize"  # maximize | minimize, or a list of them (one per metrics entry)
    directions: Any = None  # a multi-objective search: [maximize, minimize], one per objective.metrics entry
    study_name: str | None = None  # the study to create or continue (default: vggtrain)
    storage: str | None = None  # null: study.journal in the sweep folder; a journal file path or a database URL
    n_trials: int = 20  # trials of the whole study, over every run of the command and every sweep sharing it
    n_jobs: int = 1  # trials launched at once (at most what the launcher runs at once)
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    pruner: Any = None  # e.g. {_target_: optuna.pruners.MedianPruner, n_warmup_steps: 3}; null: no pruning
    params: Any = None  # {key: interval(...) | tag(log, interval(...)) | range(...) | choice(...) | value}
    metrics: Any = None  # null: objective.metrics, else the job's return value (objective.metric); or metrics.json keys
    folds: int = 0  # >= 2: each trial runs this many jobs, one per fold (dataset.folds), and reports their mean
    retries: int = 1  # a trial whose sweep died is run again this many times
    heartbeat_seconds: float = 30.0  # how often a sweep marks its running trials alive
    grace_seconds: float = 120.0  # a running trial of another machine with no heartbeat for this long is dead
    plots: bool = True  # optimization_history.png and the other plots in the sweep folder


ConfigStore.instance().store(
    group="hydra/sweeper", name="vggtrain_optuna", node=VggtrainOptunaConf, provider="vggtrain"
)
