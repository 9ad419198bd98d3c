"""The training task: data, model and optimizer from the config, Keras `fit`, then the test split.

    python run.py                      # VGG19 on the bundled digits
    python run.py dataset=cifar dataset.data_dir=/data/cifar10 strategy=mirrored

The run folder gets checkpoints/{best,last}.keras, history.csv, tensorboard/
and metrics.json. `train` returns the objective (best `objective.metric`).
In a multi-worker run only the chief writes there; the other workers write
the same files to a temporary folder (saving needs every worker) and delete it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from trainer import distribute, optim
from trainer.callbacks import Preempted, training_callbacks
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.models.vgg19 import build_vgg19
from trainer.reports import write_atomic, write_json
from trainer.tasks.common import evaluate_checkpoint, run_folder, setup_strategy
from trainer.tasks.data import Data, load_data

log = logging.getLogger(__name__)

METRICS = ("loss", "accuracy")


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes: equal exactly when two models hold identical weights."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def _objective_metric(settings: Config) -> str:
    metric = settings.objective.metric
    names = [*METRICS, *(f"val_{name}" for name in METRICS)]
    if metric not in names:
        raise ConfigError(f"objective.metric must be one of {names}; got {metric!r}")
    return metric


def _build_model(settings: Config, data: Data, steps_per_epoch: int, replicas: int) -> keras.Model:
    """VGG19 compiled with the configured optimizer; call inside `strategy.scope()`."""
    model = build_vgg19(
        num_classes=len(data.class_names),
        input_shape=data.input_shape,
        width_multiplier=settings.model.width_multiplier,
        fc_units=settings.model.fc_units,
        dropout=settings.model.dropout,
        weight_decay=settings.model.weight_decay,
        batch_norm=settings.model.batch_norm,
    )
    opt = settings.optimizer
    lr = opt.lr * replicas if opt.scale_with_replicas else opt.lr
    learning_rate = optim.build_learning_rate(
        opt.schedule.name,
        lr,
        steps_per_epoch,
        settings.trainer.epochs,
        warmup_epochs=opt.schedule.warmup_epochs,
        alpha=opt.schedule.alpha,
        boundaries=list(opt.schedule.boundaries),
        factor=opt.schedule.factor,
    )
    optimizer = optim.build_optimizer(
        opt.name, learning_rate, opt.momentum, opt.nesterov, opt.weight_decay, opt.clipnorm
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    log.info(
        "Model %s: %s parameters, input %s, lr %g <model=%s optimizer=%s>",
        model.name,
        f"{model.count_params():,}",
        data.input_shape,
        lr,
        settings.model.name,
        opt.name,
    )
    return model


def resolve_resume(resume: str | None, output_dir: str) -> str:
    """The folder a run writes to: `resume` (an earlier run folder, or `latest`) or Hydra's new folder.

    Raises:
        ConfigError: `resume` names no run folder.
    """
    if not resume:
        return output_dir
    if resume == "latest":
        candidates = sorted(Path("outputs").glob("*/*/backup"), key=lambda path: path.stat().st_mtime)
        if not candidates:
            raise ConfigError("resume=latest: no run folder under outputs/ has a backup to resume from")
        return str(candidates[-1].parent)
    if not (Path(resume) / "history.csv").is_file() and not (Path(resume) / "backup").is_dir():
        raise ConfigError(f"resume={resume}: not a training run folder (no history.csv or backup/ in it)")
    return resume


def backup_folder(run_dir: Path, output_dir: str, worker: str | None) -> Path:
    """Where BackupAndRestore keeps this worker's state: the run folder for the chief (`worker=None`),
    else a temporary folder named after the run and the worker, so a rerun of that worker (with
    resume=PATH) finds it and two workers never share one."""
    if worker is None:
        return run_dir / "backup"
    key = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"vggtrain-backup-{key}-{worker}"


def prepare_resume(run_dir: Path, backup_dir: Path, resume: str | None) -> int:
    """Epochs already done per the backup; trims history.csv to exactly those, so none appears twice.

    Raises:
        ConfigError: `resume` points at a run that finished (its backup is gone).
    """
    metadata = backup_dir / "training_metadata.json"
    done = json.loads(metadata.read_text())["epoch"] if metadata.is_file() else 0
    history_csv = run_dir / "history.csv"
    if resume and not done and history_csv.is_file():
        raise ConfigError(f"resume={resume}: the run finished (no backup left); start a new run instead")
    if history_csv.is_file():
        lines = history_csv.read_text().splitlines(keepends=True)
        kept = lines[:1] + [line for line in lines[1:] if int(line.split(",", 1)[0]) < done]
        if kept != lines:
            write_atomic(history_csv, lambda temporary: temporary.write_text("".join(kept)))
    if done:
        log.info("Resuming after epoch %d from %s <resume=%s>", done, backup_dir, resume)
    return done


def read_history(path: Path) -> dict[str, list[float]]:
    """history.csv as columns of floats: every epoch of the run, resumed parts included."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {name: [float(row[name]) for row in rows] for name in rows[0]} if rows else {}


def train(settings: Config) -> float | None:
    """Trains, evaluates the best checkpoint on the test split and writes metrics.json.

    Returns:
        The best value of `objective.metric` over the epochs, as a plain float.
    """
    metric = _objective_metric(settings)
    strategy = setup_strategy(settings)
    keras.utils.set_random_seed(settings.seed)
    batch = settings.trainer.batch_size
    per_replica = batch // strategy.num_replicas_in_sync
    data = load_data(settings.dataset, batch, settings.seed)
    steps_per_epoch = settings.trainer.steps_per_epoch or data.num_examples["train"] // batch
    if steps_per_epoch < 1:
        raise ConfigError(
            f"trainer.batch_size={batch} is larger than the {data.num_examples['train']} training records"
        )
    log.info(
        "Global batch %d = %d replica(s) x %d, %d steps per epoch <trainer.batch_size=%d>",
        batch,
        strategy.num_replicas_in_sync,
        per_replica,
        steps_per_epoch,
        batch,
    )

    with strategy.scope():
        model = _build_model(settings, data, steps_per_epoch, strategy.num_replicas_in_sync)

    chief = distribute.is_chief(strategy)
    sample_images = next(iter(data.train.take(1)))[0][:8].numpy() if chief else None
    output_dir = resolve_resume(settings.resume, settings.output_dir)
    with run_folder(output_dir, chief) as run_dir, distribute.collective_errors(strategy):
        backup_dir = backup_folder(run_dir, output_dir, None if chief else distribute.worker_name(strategy))
        done = prepare_resume(run_dir, backup_dir, settings.resume)
        if done >= settings.trainer.epochs:
            raise ConfigError(f"resume={settings.resume}: {done} epochs are done already; raise trainer.epochs")
        started = time.perf_counter()
        try:
            model.fit(
                data.train,
                epochs=settings.trainer.epochs,
                steps_per_epoch=steps_per_epoch,
                validation_data=data.val,
                verbose=settings.trainer.verbose if chief else 0,
                shuffle=False,  # the pipeline shuffles, seeded
                callbacks=training_callbacks(
                    run_dir,
                    metric,
                    settings.objective.mode,
                    backup_dir,
                    settings.trainer.save_every_steps,
                    sample_images,
                    settings.dataset.standardize,
                ),
            )
        except Preempted as stop:
            log.warning(
                "Stopped by SIGTERM: epoch %d will be redone from the backup in %s. To continue, rerun "
                "the same command with resume=%s",
                stop.epoch + 1,
                backup_dir,
                run_dir,
            )
            return None
        seconds = time.perf_counter() - started
        history = read_history(run_dir / "history.csv")
        values = history[metric]
        pick = max if settings.objective.mode == "max" else min
        best_epoch = values.index(pick(values))

        test = evaluate_checkpoint(
            strategy,
            run_dir / "checkpoints" / "best.keras",
            data.test,
            data.class_names,
            data.input_shape,
            run_dir,
            "test",
        )
        metrics = {
            "objective": float(values[best_epoch]),
            "objective_metric": metric,
            "best_epoch": best_epoch + 1,
            "epochs_completed": len(values),
            "val_accuracy": float(history["val_accuracy"][best_epoch]),
            "val_loss": float(history["val_loss"][best_epoch]),
            **{f"test_{name}": value for name, value in test.items() if name != "checkpoint"},
            "train_seconds": round(seconds, 2),
            "train_images_per_second": round((len(values) - done) * steps_per_epoch * batch / seconds, 1),
            "num_examples": data.num_examples,
            "num_replicas": strategy.num_replicas_in_sync,
            "weights_sha256": weights_fingerprint(model),
        }
        write_json(run_dir / "metrics.json", metrics)
        log.info(
            "Test accuracy %.4f, test loss %.4f (best epoch %d by %s) in %.0f s",
            metrics["test_accuracy"],
            metrics["test_loss"],
            best_epoch + 1,
            metric,
            seconds,
        )
        log.info("Final weights sha256 %s", metrics["weights_sha256"])  # equal on every worker
    return metrics["objective"]
