"""Experiment trackers: MLflow and Weights & Biases, fed per epoch by Keras and given the run folder's files at the end.

    python run.py logger=mlflow                                      # SQLite store: outputs/mlflow.db
    python run.py logger=mlflow logger.tracking_uri=http://127.0.0.1:5000
    python run.py logger=mlflow logger.register_model=digits          # best.keras in the model registry
    python run.py logger=wandb                                       # offline: RUN/wandb/, `wandb sync` later
    python run.py logger=many name=baseline tags=[cifar,sgd]

Each tracker is a Keras callback. `connect` runs at start-up: a server that
cannot be reached is one `ConfigError` before any training. `start` opens the
tracked run (or reopens the one whose id `tracking.json` in the run folder
holds, when resuming) and logs params, name and tags; `on_epoch_end` logs the
epoch's metrics and learning rate; `finish` uploads the files (MLflow: and the
best checkpoint as an MLflow Model, `logger.register_model=NAME` registers it)
and closes the run. After start-up a tracker never stops training: a failed call is a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import keras

from trainer.errors import ConfigError
from trainer.runs.atomic import write_json
from trainer.runs.checkpoints import BEST

log = logging.getLogger(__name__)

RUN_IDS_FILE = "tracking.json"  # {tracker name: run id, URI_KEY: MLflow store}: a resume reopens them, a watcher joins
PARENT_FILE = "mlflow_parent.json"  # in a sweep folder: the parent run of the sweep's jobs
DEFAULT_MLFLOW_DB = "outputs/mlflow.db"  # relative to the launch folder


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config (dataclasses, namespaces, dicts) as {"a.b.c": leaf}; lists stay whole leaves."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    elif isinstance(value, SimpleNamespace):
        value = vars(value)
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


URI_KEY = "mlflow_tracking_uri"  # tracking.json: the MLflow store that holds the run


def read_run_ids(run_dir: Path) -> dict[str, str]:
    try:
        return json.loads((run_dir / RUN_IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _save_run_id(run_dir: Path, tracker: str, run_id: str) -> None:
    ids = read_run_ids(run_dir)
    ids[tracker] = run_id
    write_json(run_dir / RUN_IDS_FILE, ids)


def _numbers(logs: dict | None) -> dict[str, float]:
    """The finite numeric entries of Keras logs (or metrics.json), as floats; never a string such as a run's
    name, even one that reads as a number."""
    values = {}
    for key, value in (logs or {}).items():
        if isinstance(value, str | bytes):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            with contextlib.suppress(TypeError, ValueError):
                value = float(value)  # tensors and numpy scalars
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            values[key] = float(value)
    return values


class Tracker(keras.callbacks.Callback):
    """One experiment tracker; subclasses implement `_start`, `_log`, `_finish`."""

    key = "tracker"

    def connect(self) -> None:
        """Checks the backend at start-up; raises ConfigError if it cannot be used."""

    def start(self, run_dir: Path, name: str, tags: list[str], params: dict[str, Any], parent: Path | None) -> str:
        """Opens (or reopens, by the id in `run_dir/tracking.json`) the tracked run; returns its id."""
        run_id = self._start(run_dir, name, tags, params, read_run_ids(run_dir).get(self.key), parent)
        _save_run_id(run_dir, self.key, run_id)
        return run_id

    def on_epoch_end(self, epoch, logs=None):
        try:
            self._log(epoch + 1, _numbers(logs))
        except Exception as error:  # a tracker never stops training
            log.warning("%s: could not log epoch %d: %s", self.key, epoch + 1, error)

    def join(self, run_dir: Path) -> bool:
        """Logs, from now on, into the tracked run of `run_dir` (its `tracking.json`) that another process opened:
        a watcher beside training adds its figures without starting or closing the run. Returns whether it can."""
        ids = read_run_ids(run_dir)
        run_id = ids.get(self.key)
        if run_id is None or not self._join(run_id, ids):
            return False
        log.info("%s: logging into the run's tracked run %s", self.key, run_id)
        return True

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Logs `metrics` at `step` into the joined run; a failure is a warning."""
        try:
            self._log(step, _numbers(metrics))
        except Exception as error:
            log.warning("%s: could not log step %d: %s", self.key, step, error)

    def _join(self, run_id: str, ids: dict[str, str]) -> bool:
        log.info("%s: a second process cannot write into its run; the watcher's figures stay in its files", self.key)
        return False

    def finish(self, metrics: dict[str, Any], files: Iterable[Path], run_dir: Path, ok: bool = True) -> None:
        """Logs the final metrics and `files` (those that exist) and closes the run."""
        try:
            self._finish(_numbers(metrics), [path for path in files if path.is_file()], run_dir, ok)
        except Exception as error:
            log.warning("%s: could not finish the run: %s", self.key, error)

    def _start(self, run_dir, name, tags, params, run_id, parent) -> str:
        raise NotImplementedError

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def _finish(self, metrics: dict[str, float], files: list[Path], run_dir: Path, ok: bool) -> None:
        raise NotImplementedError


def default_tracking_uri() -> str:
    return f"sqlite:///{Path(DEFAULT_MLFLOW_DB).resolve()}"


def _file_store(uri: str) -> bool:
    """Whether MLflow would read `uri` as its file store: `file:...` or a bare path (`mlruns`, `/data/mlruns`)."""
    scheme = urllib.parse.urlparse(uri).scheme
    return uri not in ("databricks", "databricks-uc") and (scheme in ("", "file") or len(scheme) == 1)


class MLflowTracker(Tracker):
    """MLflow through `MlflowClient` (no global active run), to a SQLite file or a tracking server."""

    key = "mlflow"

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str,
        timeout_seconds: float = 10.0,
        register_model: str | None = None,
    ):
        super().__init__()
        from_environment = os.environ.get("MLFLOW_TRACKING_URI") if not tracking_uri else None
        self.uri = tracking_uri or from_environment or default_tracking_uri()
        self.source = "MLFLOW_TRACKING_URI" if from_environment else "logger.tracking_uri"
        if register_model is not None and (not register_model.strip() or any(c in register_model for c in "/:")):
            raise ConfigError(
                f"logger.register_model={register_model!r}: a registered model's name must be non-empty and hold "
                f"no '/' or ':' (MLflow refuses it after the whole run)"
            )
        if _file_store(self.uri):
            raise ConfigError(
                f"{self.source}={self.uri}: MLflow's file store is in maintenance mode and cannot hold this run's "
                f"model; use a database (sqlite:///PATH/mlflow.db) or a tracking server (http://HOST:5000)"
            )
        self.experiment, self.timeout, self.register_model = experiment, timeout_seconds, register_model
        self.client, self.run_id, self.experiment_id = None, None, None
        # (tracking URI, run id, best.keras, registered name) -> the logged model's URI; set by the task that
        # trains (`trainer.serving.mlflow_model.log_model`): None logs no model
        self.model_logger: Callable[[str, str, Path, str | None], str] | None = None

    def connect(self) -> None:
        if self.uri.startswith(("http://", "https://")):
            # A dead server must fail in seconds, at start-up, not after minutes of retries mid-run.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(math.ceil(self.timeout))))
        elif self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        try:
            import mlflow  # noqa: F401
        except ImportError:
            raise ConfigError('logger=mlflow needs the mlflow package: pip install -e ".[track]"') from None
        # "Creating initial MLflow database tables..." and the like: MLflow's bookkeeping, not the run's.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        try:
            self.experiment_id = self._experiment_id(self.experiment)
        except Exception as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise ConfigError(f"{self.source}={self.uri}: cannot use the MLflow tracking store ({reason})") from None
        log.info("MLflow: experiment %r at %s <%s>", self.experiment, self.uri, self.source)

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):  # else artifacts would land in ./mlruns of the launch folder
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created meanwhile by a parallel job
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _start(self, run_dir, name, tags, params, run_id, parent) -> str:
        from mlflow.entities import Param, RunTag

        if run_id:
            try:
                self.client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
                log.info("MLflow: resuming run %s", run_id)
                return run_id
            except Exception as error:
                log.warning("MLflow: run %s of %s not found (%s); starting a new one", run_id, RUN_IDS_FILE, error)
        run_tags = {"run_dir": str(run_dir.resolve()), "tags": ",".join(tags), **{tag: "true" for tag in tags}}
        if parent is not None:
            run_tags["mlflow.parentRunId"] = self.parent_run(parent)
        run = self.client.create_run(self.experiment_id, tags=run_tags, run_name=name)
        self.run_id = run.info.run_id
        _save_run_id(run_dir, URI_KEY, self.uri)  # where a watcher beside training finds the run
        items = [Param(key, str(value)[:6000]) for key, value in sorted(params.items())]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("vggtrain.name", name)])
        log.info("MLflow: run %s (%s)", self.run_id, name)
        return self.run_id

    def parent_run(self, sweep_dir: Path) -> str:
        """The sweep's parent run id, created by the first job (under a file lock, for parallel launchers)."""
        path = sweep_dir / PARENT_FILE
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with open(sweep_dir / f"{PARENT_FILE}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.is_file():
                return json.loads(path.read_text())["run_id"]
            run = self.client.create_run(
                self.experiment_id, tags={"sweep_dir": str(sweep_dir.resolve())}, run_name=f"sweep {sweep_dir.name}"
            )
            write_json(path, {"run_id": run.info.run_id, "tracking_uri": self.uri})
            return run.info.run_id

    def _join(self, run_id: str, ids: dict[str, str]) -> bool:
        from mlflow import MlflowClient

        uri = ids.get(URI_KEY, self.uri)  # the store the run is in, wherever this process was started
        self.client, self.uri = MlflowClient(tracking_uri=uri), uri
        self.run_id = run_id  # logging by id: the run stays as its training left it (running or finished)
        return True

    def _log(self, step, metrics) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def _finish(self, metrics, files, run_dir, ok) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        final = [Metric(f"final/{key}", value, now, 0) for key, value in metrics.items()]
        for start in range(0, len(final), 1000):
            self.client.log_batch(self.run_id, metrics=final[start : start + 1000])
        for path in files:
            relative = path.parent.relative_to(run_dir) if path.is_relative_to(run_dir) else Path()
            self.client.log_artifact(self.run_id, str(path), None if str(relative) == "." else str(relative))
        best = run_dir / BEST
        if ok and best.is_file() and self.model_logger is not None:
            try:
                uri = self.model_logger(self.uri, self.run_id, best, self.register_model)
            except Exception as error:  # a tracker never fails the run: its files are written already
                log.warning("MLflow: could not log %s as an MLflow model: %s", best, error)
            else:
                registered = f", registered as {self.register_model!r}" if self.register_model else ""
                log.info("MLflow: best.keras logged as the model runs:/%s/model (%s)%s", self.run_id, uri, registered)
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def finish_parent(sweep_dir: Path, best: float | None = None) -> None:
    """Closes a sweep's MLflow parent run (if its jobs made one), logging the best objective."""
    path = sweep_dir / PARENT_FILE
    if not path.is_file():
        return
    from mlflow import MlflowClient

    entry = json.loads(path.read_text())
    client = MlflowClient(tracking_uri=entry["tracking_uri"])
    if best is not None and math.isfinite(best):
        client.log_metric(entry["run_id"], "best_objective", best)
    client.set_terminated(entry["run_id"], "FINISHED")


class WandbTracker(Tracker):
    """Weights & Biases; offline by default, writing RUN/wandb/ (`wandb sync` uploads it later)."""

    key = "wandb"

    def __init__(self, project: str, mode: str = "offline", entity: str | None = None, timeout_seconds: float = 10.0):
        super().__init__()
        self.project, self.entity, self.timeout = project, entity, timeout_seconds
        self.mode = os.environ.get("WANDB_MODE") or mode  # WANDB_MODE=offline wins, as W&B documents
        self.run = None

    def connect(self) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError('logger=wandb needs the wandb package: pip install -e ".[track]"') from None

    def _start(self, run_dir, name, tags, params, run_id, parent) -> str:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                dir=str(run_dir),
                id=run_id,
                resume="allow" if run_id else None,
                name=name,
                tags=list(tags),
                group=str(parent.resolve()) if parent is not None else None,
                config=params,
                mode=self.mode,
                reinit="create_new",
                settings=wandb.Settings(init_timeout=max(self.timeout, 30), console="off"),
            )
        except Exception as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise ConfigError(f"logger=wandb (logger.wandb_mode={self.mode}): cannot start a run ({reason})") from None
        log.info("W&B: run %s (%s, %s) in %s", self.run.id, name, self.mode, run_dir / "wandb")
        return self.run.id

    def _log(self, step, metrics) -> None:
        self.run.log({**metrics, "epoch": step}, step=step)

    def _finish(self, metrics, files, run_dir, ok) -> None:
        self.run.summary.update({f"final/{key}": value for key, value in metrics.items()})
        for path in files:
            self.run.save(str(path), base_path=str(run_dir), policy="now")
        self.run.finish(exit_code=0 if ok else 1)
        # finish() only tells W&B's service process the run is done; the service writes and closes
        # RUN/wandb/ later. Its teardown waits for that, so the folder is whole when the run returns.
        import wandb

        wandb.teardown()


@contextlib.contextmanager
def tracking(
    trackers: list[Tracker], run_dir: Path, name: str, tags: list[str], params: dict, parent: Path | None
) -> Iterator[list[Tracker]]:
    """Starts every tracker; on an exception marks their runs failed (the caller finishes them on success)."""
    for tracker in trackers:
        tracker.start(run_dir, name, tags, params, parent)
    try:
        yield trackers
    except BaseException:
        for tracker in trackers:
            tracker.finish({}, [], run_dir, ok=False)
        raise
