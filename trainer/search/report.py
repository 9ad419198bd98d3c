"""What a search leaves in its sweep folder, rewritten after every batch of trials and at the end:

- `study.csv`: every trial, its state (complete, pruned, failed, running, waiting), values and parameters;
- `best.csv`: the best trial, or the Pareto front of a multi-objective search;
- `optimization_history.png`, `param_importances.png`, `parallel_coordinate.png`, from
  `optuna.visualization.matplotlib`, once enough trials are complete; a multi-objective search draws
  `pareto_front.png` instead: every complete trial a point, the front a line through its trials (ours for two
  objectives, such as accuracy against latency; Optuna's for three).

`study.csv` and `best.csv` give each trial's run folder (`run_dir`).

    optuna-dashboard outputs/search/vgg19/study.journal     # the same study, live, in a browser
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import warnings
from pathlib import Path
from typing import Any

from trainer.runs.atomic import atomic_path
from trainer.search.study import INTERRUPTED, OUTCOME, RETRY_OF, RUN_DIRS, SURPLUS, was_killed
from trainer.tracking.sweep import SPACE_FILE

log = logging.getLogger(__name__)

STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}


def state_name(trial: Any) -> str:
    """A trial's state as the tables show it; a surplus trial (asked past n_trials) is `surplus`, one stopped by
    Ctrl-C or SIGTERM `interrupted`."""
    if trial.user_attrs.get(SURPLUS):
        return "surplus"
    if trial.user_attrs.get(INTERRUPTED) and trial.state.name == "FAIL":
        return "interrupted"
    return STATES.get(trial.state.name, trial.state.name.lower())


def _rows(trials: list[Any], names: list[str], study_attrs: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    keys = sorted({key for trial in trials for key in trial.params})
    columns = ["trial", "state", *names, *keys, "epochs_reported", "retry_of", "killed", "seconds", "run_dir"]
    rows = []
    for trial in trials:
        values = trial.values or [None] * len(names)
        if trial.state.name == "PRUNED":  # Optuna keeps the last value the pruner was told: maybe another metric
            values = [(trial.user_attrs.get(OUTCOME) or {}).get("metrics", {}).get("objective")]  # the run's own
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
        row = {
            "trial": trial.number,
            "state": state_name(trial),
            **dict(zip(names, values, strict=True)),
            **trial.params,
        }
        row.update(
            epochs_reported=len(trial.intermediate_values) or None,
            retry_of=trial.user_attrs.get(RETRY_OF),
            killed=was_killed(trial, study_attrs) or None,
            seconds=None if seconds is None else round(seconds, 1),
            run_dir=" ".join(trial.user_attrs.get(RUN_DIRS, [])) or None,
        )
        rows.append(row)
    return columns, rows


def write_space(sweep_dir: Path, distributions: dict[str, Any]) -> None:
    """`space.json`: the searched keys and their distributions, for TensorBoard's HParams (ints as ints, choices as
    choices: `trainer.tracking.sweep.space_hparam`)."""
    from optuna.distributions import distribution_to_json

    text = json.dumps({key: distribution_to_json(value) for key, value in distributions.items()}, indent=2)
    with atomic_path(sweep_dir / SPACE_FILE) as temporary:
        Path(temporary).write_text(text + "\n")


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as temporary, open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({key: ("" if value is None else value) for key, value in row.items()} for row in rows)


def best_trials(study: Any) -> list[Any]:
    """The best trial of a single-objective study, the Pareto front of a multi-objective one ([] before any)."""
    with contextlib.suppress(ValueError):
        return list(study.best_trials) if len(study.directions) > 1 else [study.best_trial]
    return []


def write_report(study: Any, sweep_dir: Path, names: list[str], plots: bool = True) -> None:
    """`study.csv` and `best.csv` (`names`: one column per objective), then the plots; a plot that cannot be drawn
    yet (too few complete trials) is left out with no error."""
    trials = [trial for trial in study.get_trials(deepcopy=False) if not trial.user_attrs.get(SURPLUS)]
    attrs = study.user_attrs
    columns, rows = _rows(trials, names, attrs)
    _write_csv(sweep_dir / "study.csv", columns, rows)
    _write_csv(sweep_dir / "best.csv", columns, _rows(best_trials(study), names, attrs)[1])
    if plots:
        draw_plots(study, sweep_dir, names)


def _drawings(plots: Any, names: list[str], complete: int) -> list[tuple[str, Any, dict]]:
    """(file, optuna.visualization.matplotlib function, its arguments) of each plot `names` (the objectives) and
    `complete` trials allow."""
    if len(names) == 2:
        return [("pareto_front.png", plot_pareto_front, {"target_names": names})]
    if len(names) > 1:
        return [("pareto_front.png", plots.plot_pareto_front, {"target_names": names})] if len(names) == 3 else []
    target = {"target_name": names[0]}
    drawings = [
        ("optimization_history.png", plots.plot_optimization_history, target),
        ("parallel_coordinate.png", plots.plot_parallel_coordinate, target),
    ]
    if complete >= 2:  # importances compare trials
        drawings.append(("param_importances.png", plots.plot_param_importances, target))
    return drawings


def plot_pareto_front(study: Any, target_names: list[str]) -> Any:
    """Two objectives: every complete trial as a point (the second objective across, the first up), the Pareto
    front as a line through its trials, each labelled with its number. Returns the axes."""
    import matplotlib.pyplot as plt

    trials = [trial for trial in study.get_trials(deepcopy=False) if trial.state.name == "COMPLETE"]
    front = sorted(best_trials(study), key=lambda trial: trial.values[1])
    _, axes = plt.subplots(figsize=(6.4, 4.8))
    axes.scatter([t.values[1] for t in trials], [t.values[0] for t in trials], alpha=0.5, label="trials")
    line = {"color": "tab:red", "drawstyle": "steps-post", "label": "Pareto front"}
    axes.plot([t.values[1] for t in front], [t.values[0] for t in front], "o-", **line)
    for trial in front:
        axes.annotate(str(trial.number), (trial.values[1], trial.values[0]), textcoords="offset points", xytext=(4, 4))
    directions = [direction.name.lower() for direction in study.directions]
    axes.set_xlabel(f"{target_names[1]} ({directions[1]})")
    axes.set_ylabel(f"{target_names[0]} ({directions[0]})")
    axes.set_title(f"Pareto front: {len(front)} of {len(trials)} complete trials (best.csv lists them)")
    axes.grid(alpha=0.3)
    axes.legend()
    return axes


def draw_plots(study: Any, sweep_dir: Path, names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    complete = sum(trial.state.name == "COMPLETE" for trial in study.get_trials(deepcopy=False))
    if not complete:
        return
    for file, draw, kwargs in _drawings(plots, names, complete):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning: the matplotlib backend is "experimental"
                axes = draw(study, **kwargs)
            figure = getattr(axes, "figure", None) or axes.flat[0].figure
            with atomic_path(sweep_dir / file) as temporary:
                figure.savefig(temporary, format="png", bbox_inches="tight", dpi=100)
            plt.close(figure)
        except Exception as error:  # noqa: BLE001 - a plot is a view: never worth stopping a search for
            log.debug("%s not drawn: %s", file, error)
