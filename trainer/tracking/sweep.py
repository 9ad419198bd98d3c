"""Hydra callbacks for sweeps: `summary.csv` in the sweep folder (one row per finished job, as it finishes),
TensorBoard HParams of every job, and closing the sweep's MLflow parent run.

    python run.py -m optimizer.lr=0.1,0.01 model.dropout=0.3,0.5
    python run.py -m hparams_search=vgg19_optuna

Rows are appended under a file lock, so parallel launchers (joblib) can share
the file, and an interrupted sweep keeps the rows of the jobs that finished.
A failed job gets a row too, with the first line of its error. At the end the
best jobs are printed as a table.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from trainer import quiet

log = logging.getLogger(__name__)

COLUMNS = [
    "job",
    "status",
    "objective",
    "val_accuracy",
    "val_loss",
    "test_accuracy",
    "test_loss",
    "epochs_completed",
    "overrides",
    "error",
    "run_dir",
]


def sweep_folder(job_dir: Path, sweep: DictConfig) -> Path:
    """The sweep folder of a job whose folder is `<sweep dir>/<hydra.sweep.subdir>` (`sweep`: `hydra.sweep`). Not
    `hydra.sweep.dir` itself: read again, it would re-resolve `${now:...}`. A subdir that cannot be resolved
    here (`${trial.number}`, a key of the job's config) counts by its unresolved text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    try:
        subdir = str(sweep.subdir)
    except InterpolationResolutionError:
        subdir = str(OmegaConf.to_container(sweep, resolve=False)["subdir"])
    return job_dir.parents[len(Path(subdir).parts) - 1]


FAILURE = "failed.txt"  # in a job's folder: the one-line error that ended the job
OUTCOME: dict[str, Any] = {}  # the last sweep of this process: {"jobs", "failed", "summary"} (run.py's exit code)


def record_failure(run_dir: Path, message: str) -> None:
    """Notes in a job's folder the error that ended it: the job returns, so the sweep goes on and its table is
    printed (Hydra's basic sweeper re-raises a job's exception before its end-of-sweep callbacks run)."""
    with contextlib.suppress(OSError):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / FAILURE).write_text(message + "\n")


def _failure(run_dir: Path) -> str:
    try:
        return (run_dir / FAILURE).read_text().strip()
    except OSError:
        return ""


def _metrics(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def summary_columns(objectives: list[str] | None) -> list[str]:
    """`COLUMNS`, then the objectives of a multi-objective search (`objective.metrics`) it lacks: latency_ms."""
    return COLUMNS + [name for name in objectives or [] if name not in COLUMNS]


def append_summary_row(summary: Path, row: dict[str, Any], columns: list[str] = COLUMNS) -> None:
    """Appends one row (writing the header first if the file is new), holding an exclusive lock."""
    summary.parent.mkdir(parents=True, exist_ok=True)
    with open(summary, "a+", newline="") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0, 2)
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            if handle.tell() == 0:
                writer.writeheader()
            writer.writerow(row)
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_summary(summary: Path) -> list[dict[str, str]]:
    """Every row of a sweep's summary file (the history of one run is `trainer.runs.history.read_rows`)."""
    with open(summary, newline="") as handle:
        return list(csv.DictReader(handle))


def _rounded(text: str, digits: int = 4) -> str:
    """A float cell to `digits` decimals (0.11999999731779099 -> 0.1200); other cells unchanged."""
    try:
        value = float(text)
    except ValueError:
        return text
    return text if text.lstrip("-").isdigit() or not math.isfinite(value) else f"{value:.{digits}f}"


def best_table(rows: list[dict[str, str]], mode: str, limit: int = 5) -> str:
    """The best finished jobs by objective, as aligned text."""
    finished = [row for row in rows if row["status"] == "complete" and row["objective"] not in ("", "nan")]
    finished.sort(key=lambda row: float(row["objective"]), reverse=(mode == "max"))
    columns = ["job", "objective", "val_accuracy", "test_accuracy", "overrides"]
    lines = [columns] + [[_rounded(row[name]) for name in columns] for row in finished[:limit]]
    widths = [max(len(line[index]) for line in lines) for index in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in lines)


FOLD_METRICS = ("objective", "val_accuracy", "val_loss", "test_accuracy", "test_loss")


def _is_fold(item: str) -> bool:
    return item.lstrip("+~").startswith("dataset.fold=")


def fold_rows(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Per configuration (a job's overrides but `dataset.fold=...`) that ran two complete folds or more: the
    mean and the standard deviation (n - 1) of each metric over its folds."""
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        items = row["overrides"].split()
        if row["status"] == "complete" and any(_is_fold(item) for item in items):
            groups.setdefault(" ".join(item for item in items if not _is_fold(item)), []).append(row)
    result = []
    for configuration, members in groups.items():
        if len(members) < 2:
            continue
        row: dict[str, Any] = {"configuration": configuration, "folds": len(members)}
        for metric in FOLD_METRICS:
            values = [float(member[metric]) for member in members if member.get(metric) not in ("", None)]
            if len(values) == len(members):
                row[f"{metric}_mean"], row[f"{metric}_std"] = statistics.mean(values), statistics.stdev(values)
        result.append(row)
    return result


def write_fold_summary(sweep_dir: Path, rows: list[dict[str, str]]) -> str | None:
    """`folds.csv` (mean and std of each metric per configuration) and its table; None without folds."""
    folds = fold_rows(rows)
    if not folds:
        return None
    columns = ["configuration", "folds"] + [f"{m}_{s}" for m in FOLD_METRICS for s in ("mean", "std")]
    with open(sweep_dir / "folds.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(folds)
    lines = [f"Cross-validation: mean +- std over the folds -> {sweep_dir / 'folds.csv'}"]
    for row in folds:
        figures = "  ".join(
            f"{metric} {row[f'{metric}_mean']:.4f} +- {row[f'{metric}_std']:.4f}"
            for metric in ("val_accuracy", "test_accuracy")
            if f"{metric}_mean" in row
        )
        lines.append(f"{figures}  ({row['folds']} folds)  {row['configuration']}")
    return "\n".join(lines)


class SweepSummary(Callback):
    """Writes `<sweep dir>/summary.csv` as jobs end and prints the best jobs when the sweep ends."""

    def __init__(self, filename: str = "summary.csv", top: int = 5) -> None:
        self.filename = filename
        self.top = top

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra = job_return.hydra_cfg.hydra if job_return.hydra_cfg else config.hydra
        if str(hydra.mode) != "RunMode.MULTIRUN":
            return
        run_dir = Path(hydra.runtime.output_dir)
        recorded = _failure(run_dir)
        ok = job_return.status == JobStatus.COMPLETED and not recorded
        metrics = _metrics(run_dir) if ok else {}
        objective = job_return.return_value if ok else None
        # Private: Hydra 1.3's return_value re-raises a failed job's error (docs/development.md, workarounds ledger)
        failure = job_return._return_value
        error = recorded or ("" if ok else (str(failure).strip().splitlines() or [repr(failure)])[0])
        row = {
            "job": hydra.job.num,
            "status": ("pruned" if metrics.get("pruned") else "complete") if ok else "failed",
            "objective": "" if objective is None or not math.isfinite(objective) else f"{objective:.6g}",
            "overrides": " ".join(job_return.overrides or []),
            "error": error,
            "run_dir": str(run_dir),
            **{key: metrics.get(key, "") for key in COLUMNS[3:8]},
        }
        columns = summary_columns(list(config.get("objective", {}).get("metrics") or []))
        row.update({name: metrics.get(name, "") for name in columns[len(COLUMNS) :]})
        append_summary_row(sweep_folder(run_dir, hydra.sweep) / self.filename, row, columns)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        summary = Path(config.hydra.sweep.dir) / self.filename
        if not summary.exists():
            return
        rows = read_summary(summary)
        failed = sum(row["status"] == "failed" for row in rows)
        mode = config.get("objective", {}).get("mode", "max")
        print(f"Sweep summary: {len(rows)} jobs, {failed} failed -> {summary}")
        print(best_table(rows, mode, self.top))
        if folds := write_fold_summary(summary.parent, rows):
            print(folds)
        OUTCOME.update(jobs=len(rows), failed=failed, summary=str(summary))


def _swept_values(config: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """{key: value} of a job's overrides: the composed value for a plain key, the option name for a group."""
    from omegaconf import OmegaConf

    values: dict[str, Any] = {}
    for override in overrides:
        key, _, raw = override.lstrip("+~").partition("=")
        if key.startswith(("hydra.", "hydra/", "trial.")):  # trial.*: which Optuna trial, no hyperparameter
            continue
        value = OmegaConf.select(config, key, default=None) if "/" not in key else None
        if isinstance(value, bool | int | float | str):
            values[key] = value
        else:
            values[key] = raw  # a group choice (model=vgg19) or a list
    return values


def write_hparams(log_dir: Path, hparams: dict[str, Any], metrics: dict[str, float], trial: str) -> None:
    """Writes one TensorBoard HParams session (the values and `hparams/<metric>` scalars) into `log_dir`."""
    tf = quiet.import_tensorflow()  # the sweep's own process (joblib's jobs ran elsewhere) may not have yet
    from tensorboard.plugins.hparams import api as hp

    with tf.summary.create_file_writer(str(log_dir)).as_default():
        hp.hparams(hparams, trial_id=trial)
        for name, value in metrics.items():
            tf.summary.scalar(f"hparams/{name}", value, step=0)
        tf.summary.flush()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def swept_keys(rows: list[dict[str, str]]) -> dict[str, list[str]]:
    """{key: its distinct values} of the keys whose value differs among the jobs of a sweep's summary rows: a
    key every job sets alike (`trainer.verbose=0`, the data folder) is no hyperparameter of the sweep."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for item in row["overrides"].split():
            key, _, value = item.lstrip("+~").partition("=")
            if key and not key.startswith(("hydra", "trial.")):
                values.setdefault(key, set()).add(value)
    return {key: sorted(found) for key, found in sorted(values.items()) if len(found) > 1}


SPACE_FILE = "space.json"  # in an Optuna sweep's folder: {key: its distribution, as optuna's distribution_to_json}


def _discrete(choices: list[Any]) -> list[Any]:
    """A choice's values in one TensorBoard type: ints stay ints, numbers with a float become floats, and a mix of
    kinds (numbers and strings) becomes strings."""
    kinds = {type(choice) for choice in choices}
    if kinds <= {int} or kinds == {bool} or kinds == {str}:
        return list(choices)
    if kinds <= {int, float}:
        return [float(choice) for choice in choices]
    return [str(choice) for choice in choices]


MAX_LISTED = 100  # an integer range of at most this many values is listed value by value


def space_hparam(key: str, distribution: dict[str, Any]):
    """A searched key as TensorBoard shows it (`distribution`: optuna's distribution_to_json, parsed): a choice as
    its values, an integer range as its integers (a long one, or a log one, as an interval), a float range as an
    interval. TensorBoard's HParams have no integer type (every number is a double, tensorboard#1998): listed
    integers are what its table and filters show as integers."""
    from tensorboard.plugins.hparams import api as hp

    name, attributes = distribution["name"], distribution["attributes"]
    if name == "CategoricalDistribution":
        return hp.HParam(key, hp.Discrete(_discrete(attributes["choices"])))
    if name == "IntDistribution":
        low, high, step = int(attributes["low"]), int(attributes["high"]), int(attributes.get("step") or 1)
        if not attributes.get("log") and (high - low) // step < MAX_LISTED:
            return hp.HParam(key, hp.Discrete(list(range(low, high + 1, step))))
        return hp.HParam(key, hp.IntInterval(low, high))
    return hp.HParam(key, hp.RealInterval(float(attributes["low"]), float(attributes["high"])))


def read_space(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """{key: distribution} of an Optuna sweep's search space ({} for a grid sweep)."""
    try:
        return {key: json.loads(text) for key, text in json.loads((sweep_dir / SPACE_FILE).read_text()).items()}
    except (OSError, ValueError):
        return {}


def _hparam(key: str, values: list[str]):
    """The key as a typed TensorBoard HParam: an interval for numbers, the values for anything else."""
    from tensorboard.plugins.hparams import api as hp

    numbers = [_number(value) for value in values]
    if all(number is not None for number in numbers):
        if all(number.is_integer() and "." not in value for number, value in zip(numbers, values, strict=True)):
            return hp.HParam(key, hp.IntInterval(int(min(numbers)), int(max(numbers))))
        return hp.HParam(key, hp.RealInterval(float(min(numbers)), float(max(numbers))))
    if set(values) <= {"true", "false", "True", "False"}:
        return hp.HParam(key, hp.Discrete([False, True]))
    return hp.HParam(key, hp.Discrete(values))


def write_hparams_config(
    log_dir: Path, keys: dict[str, list[str]], metrics: list[str], space: dict[str, dict[str, Any]] | None = None
) -> None:
    """The experiment-level HParams config, so TensorBoard's table lists every swept key (typed) and metric: a key
    of an Optuna search's `space` as it was searched, any other as its values in the summary show it."""
    tf = quiet.import_tensorflow()  # the sweep's own process (joblib's jobs ran elsewhere) may not have yet
    from tensorboard.plugins.hparams import api as hp

    space = space or {}
    hparams = [space_hparam(key, space[key]) for key in sorted(space)]
    hparams += [_hparam(key, values) for key, values in keys.items() if key not in space]
    with tf.summary.create_file_writer(str(log_dir)).as_default():
        hp.hparams_config(
            hparams=hparams,
            metrics=[hp.Metric(f"hparams/{name}", display_name=name) for name in metrics],
        )
        tf.summary.flush()


HPARAMS_METRICS = ("objective", "val_accuracy", "val_loss", "test_accuracy", "test_loss", "pruned")  # pruned: 1


class SweepHParams(Callback):
    """TensorBoard HParams for a multirun: each job's swept values and final metrics, in `<job>/tensorboard/`,
    plus the experiment's list of keys in `<sweep dir>/tensorboard/`: `tensorboard --logdir <sweep dir>`.

    Also closes the sweep's MLflow parent run (`logger=mlflow`), which the first job opened.
    """

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra = job_return.hydra_cfg.hydra if job_return.hydra_cfg else config.hydra
        if str(hydra.mode) != "RunMode.MULTIRUN" or job_return.status != JobStatus.COMPLETED:
            return
        run_dir = Path(hydra.runtime.output_dir)
        metrics = _metrics(run_dir)
        values = _swept_values(config, list(job_return.overrides or []))
        finished = {
            name: float(metrics[name])
            for name in HPARAMS_METRICS
            if isinstance(metrics.get(name), int | float | bool) and math.isfinite(metrics[name])
        }
        if not values or not finished:
            return
        try:
            write_hparams(run_dir / "tensorboard", values, finished, f"job {hydra.job.num}")
        except Exception as error:  # reporting never fails a job
            log.warning("could not write TensorBoard HParams for %s: %s", run_dir, error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = _rows_or_empty(sweep_dir / "summary.csv")
        keys, space = swept_keys(rows), read_space(sweep_dir)
        if keys or space:
            try:
                write_hparams_config(sweep_dir / "tensorboard", keys, list(HPARAMS_METRICS), space)
            except Exception as error:
                log.warning("could not write the TensorBoard HParams config in %s: %s", sweep_dir, error)
        if not (sweep_dir / "mlflow_parent.json").is_file():
            return
        from trainer.tracking.loggers import finish_parent

        objectives = [float(row["objective"]) for row in rows if row["status"] == "complete" and row["objective"]]
        mode = config.get("objective", {}).get("mode", "max")
        best = (max if mode == "max" else min)(objectives) if objectives else None
        try:
            finish_parent(sweep_dir, best)
        except Exception as error:
            log.warning("could not close the MLflow parent run of %s: %s", sweep_dir, error)


def _rows_or_empty(summary: Path) -> list[dict[str, str]]:
    return read_summary(summary) if summary.is_file() else []
