"""The `vggtrain_optuna` Hydra sweeper: an Optuna (>= 4) search whose trials are Hydra jobs.

    python run.py -m hparams_search=vgg19_optuna                       # 20 TPE trials, study vgg19
    python run.py -m hparams_search=vgg19_optuna launcher=joblib hydra.sweeper.n_jobs=2
    python run.py -m hparams_search=vgg19_optuna hydra.sweeper.pruner._target_=optuna.pruners.MedianPruner
    python run.py -m hparams_search=vgg19_asha                         # successive halving (vgg19_hyperband too)
    python run.py -m hparams_search=vgg19_optuna 'hydra.sweeper.directions=[maximize,minimize]' \
        'objective.metrics=[val_accuracy,latency_ms]' hydra.sweeper.pruner=null    # accuracy against speed

It asks the study for `n_jobs` trials at a time (Optuna's ask-and-tell), launches them
through the chosen Hydra launcher (basic, joblib, Slurm) and tells the study each job's
outcome: the float the job returns (`objective.metric`), or the `objective.metrics` of a
multi-objective search (from its metrics.json), `pruned` when the job's pruner stopped it,
failed when it raised.
With `folds: K` (hparams_search=vgg19_optuna_cv) each trial is K jobs, one per fold of
`dataset.folds`, and the study is told their mean.
The study lives in a storage (`trainer.search.study`), so the same command run again
continues it, and several sweeps can share it.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, ListConfig, OmegaConf

from trainer.errors import ConfigError, Interrupted, UserError, one_line
from trainer.fields import check_prune_metric
from trainer.search import study as studies
from trainer.search.report import best_trials, state_name, write_report, write_space
from trainer.search.space import Space, override_text, parse_space
from trainer.targets import build_target

log = logging.getLogger(__name__)

DIRECTIONS = ("maximize", "minimize")
LATENCY = "latency_ms"  # trainer.serving.latency.METRIC: an objective measured on the exported SavedModel
MODEL_KEYS = ("_target_", "name", "preprocessing", "init_from")  # the model keys its builder does not take


def _directions(direction: Any, key: str) -> list[str]:
    values = [direction] if isinstance(direction, str) else list(direction)
    values = [str(value).lower().removeprefix("direction.") for value in values]
    if not values or any(value not in DIRECTIONS for value in values):
        raise ConfigError(f"{key} must be maximize, minimize or a list of them; got {direction}")
    return values


def _plain(value: Any) -> Any:
    """A config node as plain Python (dicts, lists), resolved; anything else as it is."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


def _instantiate(config: Any, key: str) -> Any:
    """The sampler or pruner a `_target_` mapping names (None for none).

    Raises:
        ConfigError: it cannot be made (`key` named, with the reason).
    """
    if not config:
        return None
    options = dict(config)
    return build_target(key, options.pop("_target_", None), options)


def reseeded(config: Any, trials_in_study: int) -> Any:
    """The sampler config for a study that holds `trials_in_study` trials already: its `seed` moved on by that
    many, so a continued study draws new start-up parameters (the same seed on every run of the command drew
    trial 0's parameters again for the first new trial); the first run keeps the seed as given."""
    if not isinstance(config, dict) or config.get("seed") is None or not trials_in_study:
        return config
    return {**config, "seed": int(config["seed"]) + trials_in_study}


def launcher_capacity(launcher: DictConfig) -> tuple[int, str]:
    """(jobs the configured Hydra launcher runs at once, the key that says so)."""
    target = str(launcher.get("_target_", "")).lower()
    if "joblib" in target:
        jobs = launcher.get("n_jobs") or 1
        return (os.cpu_count() or 1) if jobs < 0 else jobs, "hydra.launcher.n_jobs"
    if "submitit" in target:
        return launcher.get("array_parallelism") or 256, "hydra.launcher.array_parallelism"
    return 1, "the basic launcher runs one job at a time; launcher=joblib runs several"


class OptunaSearch(Sweeper):
    """Hydra's Sweeper plugin API: `setup` once, then `sweep(arguments)` (see the module docstring)."""

    def __init__(
        self,
        direction: Any,
        study_name: str | None,
        storage: str | None,
        n_trials: int,
        n_jobs: int,
        sampler: Any,
        pruner: Any,
        params: Any,
        metrics: Any = None,
        directions: Any = None,
        folds: int = 0,
        retries: int = 1,
        heartbeat_seconds: float = 30.0,
        grace_seconds: float = 120.0,
        plots: bool = True,
    ) -> None:
        self.direction, self.study_name, self.storage = direction, study_name, storage
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.sampler_config, self.pruner_config = _plain(sampler), _plain(pruner)  # instantiated in sweep()
        self.params = _plain(params)
        self.metrics = list(metrics) if metrics else None
        self.directions = list(directions) if directions else None
        self.folds = folds
        self.retries, self.heartbeat_seconds, self.grace_seconds, self.plots = (
            retries,
            heartbeat_seconds,
            grace_seconds,
            plots,
        )
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        try:
            self._sweep(arguments)
        except UserError as error:  # one line, as run.py prints a job's bad input
            raise SystemExit(f"error: {one_line(error)}") from None

    # --- the checks before any trial ---------------------------------------------------------------------

    def _objectives(self) -> tuple[list[str], list[str]]:
        """(directions, the objective names: the metrics.json keys the study is told, as the tables show them)."""
        named = "hydra.sweeper.directions" if self.directions else "hydra.sweeper.direction"
        directions = _directions(self.directions or self.direction, named)
        if self.n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_trials must be >= 1; got {self.n_trials}")
        if self.n_jobs < 1:
            raise ConfigError(f"hydra.sweeper.n_jobs must be >= 1; got {self.n_jobs}")
        capacity, key = launcher_capacity(self.config.hydra.launcher)
        if self.n_jobs > capacity:
            raise ConfigError(
                f"hydra.sweeper.n_jobs={self.n_jobs}: the launcher runs at most {capacity} jobs at once ({key}); "
                f"lower hydra.sweeper.n_jobs"
            )
        if self.folds == 1 or self.folds < 0:
            raise ConfigError(f"hydra.sweeper.folds must be 0 (no cross-validation) or >= 2; got {self.folds}")
        if self.folds and self.pruner_config:
            raise ConfigError("hydra.sweeper.pruner: a cross-validated trial (hydra.sweeper.folds) is not pruned; "
                              "set the pruner to null")  # fmt: skip
        metrics, metrics_key = self._metrics()
        if len(directions) > 1 and not metrics:
            raise ConfigError(
                f"objective.metrics must name one metrics.json key per direction of {named} ({len(directions)}), "
                f"e.g. objective.metrics=[val_accuracy,latency_ms]"
            )
        if metrics and len(metrics) != len(directions):
            raise ConfigError(
                f"{metrics_key}={metrics} names {len(metrics)} metrics and {named}={directions} {len(directions)} "
                f"directions: give one direction per metric"
            )
        if len(directions) > 1 and self.pruner_config:
            raise ConfigError("hydra.sweeper.pruner: Optuna prunes single-objective studies only; set it to null")
        objective = self.config.get("objective") or {}
        check_prune_metric(objective.get("prune_metric"), objective.get("mode", "max"))  # before any trial
        return directions, metrics or [str(self.config.objective.metric)]

    def _metrics(self) -> tuple[list[str] | None, str]:
        """(the objectives' metrics.json keys, the key that names them): objective.metrics, or the sweeper's own
        older `metrics`; None: the job's return value (objective.metric)."""
        if self.metrics:
            return self.metrics, "hydra.sweeper.metrics"
        given = self.config.get("objective", {}).get("metrics")
        return ([str(name) for name in given] if given else None), "objective.metrics"

    def _check_servable(self, names: list[str]) -> None:
        """A latency objective is measured on each trial's exported SavedModel: the configured model, built
        untrained, is served once here, so a model that cannot be exported is one line before any trial. A model
        that does not build is left to the trial, which names the reason with the trial's own keys.

        Raises:
            ConfigError: the model builds but cannot be saved, loaded back, exported or served.
        """
        if LATENCY not in names:
            return
        from trainer.models.registry import build_model  # TensorFlow: a latency search imports it anyway
        from trainer.serving.latency import check_servable

        model = _plain(self.config.model)
        target, options = model.get("_target_"), {key: value for key, value in model.items() if key not in MODEL_KEYS}
        side = int(self.config.dataset.get("image_size") or 224)  # 0: the stored size, unknown before reading
        try:
            network = build_model(target, options, 2, (side, side, 3))
        except UserError:
            return
        log.info("Serving model._target_=%s once, untrained, before any trial: %s is measured on its SavedModel",
                 target, LATENCY)  # fmt: skip
        try:
            check_servable(network)
        except Exception as error:  # noqa: BLE001 - Keras's and TensorFlow's many export errors: one line
            reason = " ".join(str(error).split())[:300] or type(error).__name__
            raise ConfigError(f"objective.metrics: {LATENCY} is measured on the exported SavedModel, and "
                              f"model._target_={target} cannot be exported: {reason}") from None  # fmt: skip

    # --- the search -------------------------------------------------------------------------------------------

    def _sweep(self, arguments: list[str]) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "A new study created" lines: ours say more
        directions, names = self._objectives()
        space = parse_space(self.params, arguments)
        self._check_servable(names)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        url = studies.storage_url(self.storage, sweep_dir)
        name = self.study_name or "vggtrain"
        sampler = _instantiate(self.sampler_config, "hydra.sweeper.sampler")
        pruner = _instantiate(self.pruner_config, "hydra.sweeper.pruner")
        study = studies.open_study(name, studies.open_storage(url), directions, sampler, pruner)
        held = len(study.get_trials(deepcopy=False))
        if held and reseeded(self.sampler_config, held) != self.sampler_config:
            study.sampler = _instantiate(reseeded(self.sampler_config, held), "hydra.sweeper.sampler")
            log.info("Sampler seeded with seed + %d, the trials in the study <hydra.sweeper.sampler.seed>", held)
        studies.check_space(study, name, space.distributions)
        if self.pruner_config:
            objective = self.config.objective
            studies.check_pruned_on(study, name, str(objective.get("prune_metric") or objective.metric),
                                    str(objective.metric))  # fmt: skip
        write_space(sweep_dir, space.distributions)  # TensorBoard's HParams type the keys by it
        owner = studies.Owner()
        held = studies.counted(study.get_trials(deepcopy=False))
        done = sum(trial.state.name != "WAITING" for trial in held)
        again = [str(trial.user_attrs[studies.RETRY_OF]) for trial in held
                 if trial.state.name == "WAITING" and studies.RETRY_OF in trial.user_attrs]  # fmt: skip
        log.info("Study %s in %s: %d of %d trials %s%s", name, url, min(done, self.n_trials), self.n_trials,
                 "already there: it goes on" if done or again else "to run",
                 f"; trial {', '.join(again)}, stopped, runs again" if again else "")  # fmt: skip
        while True:
            studies.fail_dead_trials(study, owner, self.grace_seconds, self.retries, log)
            left = self.n_trials - len(studies.counted(study.get_trials(deepcopy=False)))
            if left <= 0:
                break
            asked = [study.ask(space.distributions) for _ in range(min(self.n_jobs, left))]
            for trial in asked:
                owner.claim(trial)
            trials = studies.within_budget(study, asked, self.n_trials)
            try:
                if trials:
                    self._run_batch(study, trials, space, url, name, names)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the sweep stops, and the same command goes on
                stopped = studies.interrupt(study, trials, log)
                write_report(study, sweep_dir, names, plots=False)
                shown = f"trial {', '.join(map(str, stopped))} runs again" if stopped else "it goes on"
                log.warning("Sweep stopped: rerun the sweep command (%s)", shown)
                raise
            write_report(study, sweep_dir, names, self.plots)
        write_report(study, sweep_dir, names, self.plots)
        self._log_best(study, names)

    def _folds(self) -> list[int | None]:
        """The folds each trial runs: [None] (one job), or 0..K-1 when the search cross-validates."""
        return list(range(self.folds)) if self.folds else [None]

    def _run_batch(self, study: Any, trials: list[Any], space: Space, url: str, name: str, names: list[str]) -> None:
        folds = self._folds()
        batch = [self._job_overrides(trial, space, url, name, fold) for trial in trials for fold in folds]
        with studies.heartbeat(trials, self.heartbeat_seconds):
            try:
                returns = self.launcher.launch(batch, initial_job_idx=trials[0].number * len(folds))
            except Exception as error:  # noqa: BLE001 - a launcher's own failure (submitit: a job's process died)
                returns = [None] * len(batch)
                reason = " ".join(str(error).split())[:300]
                log.error("error: the launcher lost trials %s: %s", ", ".join(str(t.number) for t in trials), reason)
        told = [self._tell(study, trial, returns[index * len(folds) : (index + 1) * len(folds)], names)
                for index, trial in enumerate(trials)]  # fmt: skip
        if not all(told):  # a job in another process (joblib, Slurm) was stopped by Ctrl-C or SIGTERM
            raise Interrupted("interrupted: a trial's job was stopped; to continue, rerun the sweep command")

    def _job_overrides(self, trial: Any, space: Space, url: str, name: str, fold: int | None) -> list[str]:
        told = [f"trial.number={trial.number}", f"trial.study={override_text(name)}",
                f"trial.storage={override_text(url)}"]  # fmt: skip
        if self.pruner_config:
            told.append(f"trial.pruner={override_text(self.pruner_config)}")
        if fold is not None:
            told += [f"dataset.folds={self.folds}", f"dataset.fold={fold}"]
        return [*space.overrides(trial.params), *told]

    def _values(self, job: Any, outcome: dict, names: list[str]) -> list[float] | None:
        """One job's objective values: its return value, or the `metrics` it wrote; None if it gave none."""
        if job is None or job.status != JobStatus.COMPLETED:
            return None
        if len(names) > 1 or self._metrics()[0]:
            metrics = outcome.get("metrics") or {}
            values = [metrics.get(metric) for metric in names]
        else:
            values = [job.return_value]
        usable = all(isinstance(value, (int, float)) and math.isfinite(value) for value in values)
        return [float(value) for value in values] if usable else None

    def _tell(self, study: Any, trial: Any, jobs: list[Any], names: list[str]) -> bool:
        """The outcome of a trial's jobs (one, or one per fold: their mean) into the study: complete with its
        values, pruned, or failed (any of its jobs failed).

        Returns:
            False when one of its jobs was stopped by Ctrl-C or SIGTERM: the trial is left to `interrupt`.
        """
        from optuna.trial import TrialState

        from trainer.search.trial import outcome_key

        attributes = studies.frozen(study, trial.number).user_attrs
        outcomes = [attributes.get(outcome_key(fold)) or {} for fold in self._folds()]
        if any(outcome.get("state") == "interrupted" for outcome in outcomes):
            return False
        values = [self._values(job, outcome, names) for job, outcome in zip(jobs, outcomes, strict=True)]
        usable = all(value is not None for value in values)
        mean = [sum(column) / len(column) for column in zip(*values, strict=True)] if usable else None
        folders = [str(job.hydra_cfg.hydra.runtime.output_dir) for job in jobs if job is not None and job.hydra_cfg]
        if folders:  # the report lists them beside the trial (a finished trial takes no attribute: set first)
            trial.set_user_attr(studies.RUN_DIRS, folders)
        if any(outcome.get("state") == "pruned" for outcome in outcomes):
            study.tell(trial, state=TrialState.PRUNED)
        elif usable:
            study.tell(trial, values=mean)
        else:
            study.tell(trial, state=TrialState.FAIL)
        shown = " ".join(f"{n}={v:.4f}" for n, v in zip(names, mean, strict=True)) if usable else ""
        folds = f" (mean of {len(jobs)} folds)" if self.folds and usable else ""
        log.info("Trial %d: %s %s%s", trial.number, state_name(studies.frozen(study, trial.number)), shown, folds)
        return True

    def _log_best(self, study: Any, names: list[str]) -> None:
        best = best_trials(study)
        if not best:
            log.warning("No trial of study %s completed", study.study_name)
            return
        label = "Best trial" if len(names) == 1 else f"Pareto front ({len(best)} trials)"
        for trial in best:
            values = " ".join(f"{name}={value:.4f}" for name, value in zip(names, trial.values, strict=True))
            params = " ".join(f"{key}={value}" for key, value in trial.params.items())
            folders = ", ".join(trial.user_attrs.get(studies.RUN_DIRS, []))
            log.info("%s %d: %s  %s%s", label, trial.number, values, params, f"  -> {folders}" if folders else "")
