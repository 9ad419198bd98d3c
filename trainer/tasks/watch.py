"""`mode=evaluate evaluate.watch=true`: an evaluator beside training, evaluating each epoch the run commits.

    python run.py mode=evaluate checkpoint=outputs/2026-12-03/09-00-00 evaluate.watch=true

What TF Model Garden's `continuous_eval` and Keras 2's `SidecarEvaluator` did. It watches the run's
`checkpoints/last.keras` and evaluates it on the validation split once the run has committed its epoch
(the backup holds it), so it never sees an epoch a kill would redo. An epoch it was too slow for is
skipped. It writes `eval_history.csv` (a row per evaluation) and TensorBoard scalars under
`tensorboard/eval/` in its own folder (and `eval/val_accuracy`... into the run's MLflow run, by the id in
its `tracking.json`: a watcher started before the run joins it once the run writes that file, and logs there the
epochs it evaluated before), and only reads the run folder: it may run on any machine that
sees it, and never takes the run's lock. When the run writes `metrics.json`, it evaluates the last epoch
if it has not yet, then `best.keras` on the test split, and ends; without a new epoch for
`evaluate.watch_timeout` seconds, it ends too.

An `evaluator` task in TF_CONFIG (Kubeflow's TFJob, Vertex AI) runs this loop instead of training, on the
training command itself: it watches `checkpoint=RUN`, or the run folder every task was given with
`hydra.run.dir=`, waiting for the chief to create it, and writes into `RUN/eval/`.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path

import tensorflow as tf

from trainer.config.schema import Config
from trainer.data.module import DataModule
from trainer.distribute import cluster
from trainer.distribute.failures import collective_errors
from trainer.errors import ConfigError
from trainer.runs import checkpoints, history
from trainer.runs.backup import read_state
from trainer.tasks.data import load_data
from trainer.tasks.parts import build_trackers
from trainer.tasks.runtime import setup_strategy
from trainer.tasks.scoring import Evaluation, evaluate_checkpoint
from trainer.tracking.loggers import RUN_IDS_FILE, Tracker, read_run_ids

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
FILE = "eval_history.csv"
FIELDS = ("epoch", "split", "accuracy", "loss", "num_examples", "checkpoint")


def is_evaluator(settings: Config) -> bool:
    """Whether this process is the `evaluator` task of a multi-worker cluster (TF_CONFIG)."""
    options = settings.strategy
    if not options.SPANS_WORKERS:
        return False
    return cluster.worker_role(options.cluster, options.workers, options.task_index).is_evaluator


def _wait_for_run(run: Path, timeout: float) -> None:
    """Waits (up to `timeout` s) for the chief to start the run: cluster managers start every task at once."""
    started = time.monotonic()
    while not (run / history.FILE).is_file() and not (run / "backup").is_dir():
        if time.monotonic() - started > timeout:
            return
        time.sleep(POLL_SECONDS)


def _folders(settings: Config, evaluator: bool) -> tuple[Path, Path]:
    """(the run folder to watch, the watcher's own folder).

    Raises:
        ConfigError: no run folder to watch (`checkpoint=` names a `.keras` file, or nothing).
    """
    output = Path(settings.output_dir)
    shared = evaluator and not output.name.startswith(cluster.WORKER_PREFIX)  # hydra.run.dir=RUN on every task
    run = Path(settings.checkpoint) if settings.checkpoint else output if shared else None
    if evaluator and run is not None:
        _wait_for_run(run, settings.evaluate.watch_timeout)
    if run is None or not (run / ".hydra").is_dir():
        how = "give it checkpoint=RUN, or every task the same hydra.run.dir=RUN" if evaluator else "checkpoint=RUN"
        what = "TF_CONFIG's evaluator task" if evaluator else "evaluate.watch=true"
        raise ConfigError(f"{what} needs the folder of a training run to watch: {how}; got {settings.checkpoint}")
    return run, run / "eval" if evaluator else output  # the evaluator is a task of the run's job


def committed_epochs(run: Path) -> int:
    """Epochs the run has committed: its backup's while it trains, every row of history.csv once it ended."""
    if (run / "metrics.json").is_file():
        return len(history.read_rows(run / history.FILE))
    try:
        state = read_state(run / "backup")
    except ConfigError:  # being replaced: the next poll reads it
        return 0
    return state.epoch if state else 0


def _ranges(epochs: list[int]) -> str:
    """[1, 2, 3, 5] as "1-3, 5"."""
    spans: list[list[int]] = []
    for epoch in epochs:
        if spans and epoch == spans[-1][1] + 1:
            spans[-1][1] = epoch
        else:
            spans.append([epoch, epoch])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


def _epochs(count: int) -> str:
    return f"{count} epoch" if count == 1 else f"{count} epochs"


def _summary(evaluated: list[int]) -> str:
    """What the watcher evaluated: "3 epochs on val (1-2, 5)", "no epoch on val"."""
    return f"{_epochs(len(evaluated))} on val ({_ranges(evaluated)})" if evaluated else "no epoch on val"


class EvalLog:
    """eval_history.csv and the TensorBoard scalars under tensorboard/eval/, in the watcher's own folder, and
    `eval/<split>_<metric>` in the run's tracked runs (MLflow) at the epoch's step."""

    def __init__(self, folder: Path):
        self.path = folder / FILE
        self.writer = tf.summary.create_file_writer(str(folder / "tensorboard" / "eval"))
        self.trackers: list[Tracker] = []
        self.logged: list[tuple[int, dict[str, float]]] = []  # (step, figures) given to trackers, for a late one

    def join(self, run: Path, waiting: list[Tracker]) -> list[Tracker]:
        """Joins each tracker of `waiting` whose run id the run's tracking.json holds (the run writes it as it
        starts, maybe after this watcher did), and logs into it what was logged before. Returns the trackers
        still waiting for their id; one that cannot join is dropped (its `join` says why)."""
        ids = read_run_ids(run)
        still = []
        for tracker in waiting:
            if tracker.key not in ids:
                still.append(tracker)
            elif tracker.join(run):
                for step, figures in self.logged:
                    tracker.log(step, figures)
                self.trackers.append(tracker)
        return still

    def add(self, epoch: int, split: str, metrics: dict) -> None:
        new = not self.path.is_file()
        with open(self.path, "a", newline="") as handle:
            rows = csv.DictWriter(handle, FIELDS, extrasaction="ignore")
            if new:
                rows.writeheader()
            rows.writerow({"epoch": epoch, "split": split, **metrics})
        with self.writer.as_default(step=epoch):
            for name in ("accuracy", "loss"):
                tf.summary.scalar(f"{split}_{name}" if split != "val" else f"epoch_{name}", metrics[name])
        self.writer.flush()
        figures = {f"eval/{split}_{name}": metrics[name] for name in ("accuracy", "loss")}
        self.logged.append((epoch, figures))
        for tracker in self.trackers:
            tracker.log(epoch, figures)


def _evaluate(settings: Config, strategy, data: DataModule, file: Path, split: str, out: Path) -> dict:
    with collective_errors(strategy), data.named_bad_records():
        return evaluate_checkpoint(strategy, file, data, split, out, Evaluation.of(settings, report=False))


def watch(settings: Config, evaluator: bool = False) -> float:
    """Evaluates each committed epoch of the run until it ends (see the module's docstring); `evaluator`: as the
    evaluator task of a cluster, on this machine alone.

    Returns:
        The last validation accuracy (NaN if no epoch was evaluated).
    """
    run, out = _folders(settings, evaluator)
    strategy = tf.distribute.get_strategy() if evaluator else setup_strategy(settings)
    data = load_data(settings.dataset, settings.trainer.batch_size, settings.seed, check_val=True)
    out.mkdir(parents=True, exist_ok=True)
    evals, evaluated, accuracy = EvalLog(out), [], float("nan")
    waiting = evals.join(run, build_trackers(settings.logger, out / "tensorboard")[0])
    if waiting:
        names = ", ".join(tracker.key for tracker in waiting)
        log.info("%s: no run id in %s yet: logging there once the run writes one", names, run / RUN_IDS_FILE)
    idle_since, timeout = time.monotonic(), settings.evaluate.watch_timeout
    log.info("Watching %s: each epoch it commits is evaluated on the val split into %s", run, evals.path)
    while True:
        if waiting:
            waiting = evals.join(run, waiting)
        ended = (run / "metrics.json").is_file()
        last_done = evaluated[-1] if evaluated else 0
        done = committed_epochs(run)
        last = run / "checkpoints" / "last.keras"
        info = checkpoints.read_info(last) if last.is_file() else None
        if info is not None and last_done < info.epoch <= done:
            if info.epoch > last_done + 1:
                gone = _ranges(list(range(last_done + 1, info.epoch)))
                log.info("Epoch(s) %s went by unevaluated: evaluating epoch %d", gone, info.epoch)
            metrics = _evaluate(settings, strategy, data, last, "val", out)
            evals.add(info.epoch, "val", metrics)
            evaluated.append(info.epoch)
            accuracy, idle_since = metrics["accuracy"], time.monotonic()
            continue  # the next epoch may be committed already
        stopping = not ended and time.monotonic() - idle_since > timeout
        if waiting and (ended or stopping):
            names = ", ".join(tracker.key for tracker in waiting)
            log.info("%s: %s never held its run id: the figures are only in %s", names, RUN_IDS_FILE, evals.path)
        if ended:
            best = run / "checkpoints" / "best.keras"
            best_info = checkpoints.read_info(best)
            test = _evaluate(settings, strategy, data, best, "test", out)
            evals.add(best_info.epoch if best_info else done, "test", test)
            of_best = f" (epoch {best_info.epoch})" if best_info else ""
            log.info(
                "The run ended (metrics.json) after %s: evaluated %s and best.keras%s on test",
                _epochs(done),
                _summary(evaluated),
                of_best,
            )
            return accuracy
        if stopping:
            log.info(
                "No new epoch for %g s <evaluate.watch_timeout=%g>: stopping after evaluating %s",
                timeout,
                timeout,
                _summary(evaluated),
            )
            return accuracy
        time.sleep(POLL_SECONDS)
