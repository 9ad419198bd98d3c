"""The training task: data, model and optimizer from the config, Keras `fit`, then the test split.

    python run.py                      # VGG19 on the bundled digits
    python run.py dataset=cifar dataset.data_dir=/data/cifar10 strategy=mirrored

The run folder gets checkpoints/{best,last}.keras, history.csv, tensorboard/
and metrics.json. `train` returns the objective (best `objective.metric`).
In a multi-worker run only the chief writes there; the other workers write
the same files to a temporary folder (saving needs every worker) and delete it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer import distribute, folders, loggers, optim
from trainer.backup import RunBackup, remove_backup
from trainer.backup import restore as restore_backup
from trainer.callbacks import Preempted, RunLabel, training_callbacks
from trainer.checkpoints import ModelInfo
from trainer.config import Config, VGG19Config, VGG19ImageNetConfig
from trainer.errors import ConfigError, DiskError
from trainer.loss_options import build_loss
from trainer.models.finetune import set_trainable
from trainer.models.preprocessing import with_preprocessing
from trainer.models.registry import build_model
from trainer.reports import remove_temporaries, run_summary, write_json
from trainer.resume import backup_folder, prepare_resume, read_history, resolve_resume
from trainer.tasks import extensions
from trainer.tasks.common import evaluate_checkpoint, run_folder, setup_strategy
from trainer.tasks.data import Data, load_data, model_augmentation, normalization_for

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


def build_network(settings: Config, data: Data, replicas: int) -> keras.Model:
    """The configured network (float input of `data.input_shape`), uncompiled; call inside `strategy.scope()`.

    On more than one replica, VGG19's batch norm is synchronized: statistics over the global batch."""
    options = vars(settings.model)
    if isinstance(settings.model, VGG19Config):
        options = {**options, "synchronized_batch_norm": replicas > 1}
    return build_model(options, len(data.class_names), data.input_shape)


def _run_title(settings: Config, output_dir: str) -> str:
    """The run's name (its folder's last two parts), dataset and model, for the title of curves.png."""
    name = "/".join(Path(output_dir).parts[-2:])
    return f"{name}  ·  dataset={settings.dataset.name}  ·  model={settings.model.name}"


def _log_xla(model: keras.Model, jit_compile: str) -> None:
    log.info("XLA %s <trainer.jit_compile=%s>", "on" if model.jit_compile is True else "off", jit_compile)
    if model.jit_compile is True and not tf.config.list_physical_devices("GPU"):
        log.warning(
            "XLA without a GPU: on the CPU it makes VGG19 training 3-7x slower; "
            "use trainer.jit_compile=auto <trainer.jit_compile=%s>",
            jit_compile,
        )


def _compile(model: keras.Model, settings: Config, lr: float, steps_per_epoch: int, epochs: int) -> None:
    """Compiles with the configured optimizer and schedule at peak rate `lr`; call inside the scope."""
    opt = settings.optimizer
    learning_rate = optim.build_learning_rate(
        opt.schedule.name,
        lr,
        steps_per_epoch,
        epochs,
        warmup_epochs=opt.schedule.warmup_epochs,
        alpha=opt.schedule.alpha,
        boundaries=list(opt.schedule.boundaries),
        factor=opt.schedule.factor,
    )
    optimizer = optim.build_optimizer(
        opt.name, learning_rate, opt.momentum, opt.nesterov, opt.weight_decay, opt.clipnorm
    )
    if settings.trainer.precision == "mixed_float16":
        # Wrapped here rather than by compile, so the checkpoint's compile config names the loss-scale
        # optimizer: load_model rebuilds it under any global policy and loads its saved variables (wrapped
        # by compile, a float32 process rebuilt a bare Adam: "Skipping variable loading ... (117 vs 121)").
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    jit = {"auto": "auto", "true": True, "false": False}[settings.trainer.jit_compile]
    model.compile(
        optimizer=optimizer,
        loss=build_loss(settings.trainer.label_smoothing),
        metrics=["accuracy"],
        jit_compile=jit,
        steps_per_execution=settings.trainer.steps_per_execution,
    )


@dataclass(frozen=True)
class Phase:
    """Epochs [start, end) trained with the base unfrozen from `unfreeze_from`, at lr x `lr_scale`."""

    start: int
    end: int
    unfreeze_from: str | None  # None: the whole base frozen; "all": nothing frozen
    lr_scale: float


def phases(settings: Config) -> list[Phase]:
    """One phase for a model trained from scratch; for ImageNet weights, head first, then fine-tuning."""
    epochs = settings.trainer.epochs
    if not isinstance(settings.model, VGG19ImageNetConfig):
        return [Phase(0, epochs, "all", 1.0)]
    tune = settings.finetune
    freeze = min(tune.freeze_epochs, epochs)
    second = [Phase(freeze, epochs, tune.unfreeze_from, tune.lr_multiplier)] if freeze < epochs else []
    return ([Phase(0, freeze, None, 1.0)] if freeze else []) + second


def train(settings: Config) -> float | None:
    """Trains, evaluates the best checkpoint on the test split and writes metrics.json.

    Returns:
        The best value of `objective.metric` over the epochs, as a plain float (None if preempted).
    """
    metric = _objective_metric(settings)
    strategy = setup_strategy(settings)
    chief = distribute.is_chief(strategy)
    trackers = extensions.trackers(settings) if chief else []  # only the chief logs; a dead server fails here
    extra_callbacks = extensions.plateau_callbacks(settings)
    keras.utils.set_random_seed(settings.seed)
    batch = settings.trainer.batch_size
    replicas = strategy.num_replicas_in_sync
    data = load_data(settings.dataset, batch, settings.seed, num_workers=distribute.num_input_pipelines(strategy))
    steps_per_epoch = settings.trainer.steps_per_epoch or data.train_steps or data.num_examples["train"] // batch
    if steps_per_epoch < 1:
        raise ConfigError(
            f"trainer.batch_size={batch} is larger than the {data.num_examples['train']} training records"
        )
    log.info(
        "Global batch %d = %d replica(s) x %d, %d steps per epoch <trainer.batch_size=%d>",
        batch,
        replicas,
        batch // replicas,
        steps_per_epoch,
        batch,
    )
    opt = settings.optimizer
    lr = optim.peak_learning_rate(opt.lr, batch, opt.lr_batch_size, replicas, opt.scale_with_replicas)
    if opt.lr_batch_size and lr != opt.lr:
        log.info(
            "Peak lr %g = %g x batch %d / %d (linear scaling) <optimizer.lr_batch_size=%d>",
            lr,
            opt.lr,
            batch,
            opt.lr_batch_size,
            opt.lr_batch_size,
        )
    keras.mixed_precision.set_global_policy(settings.trainer.precision)  # before any layer is built
    normalization = normalization_for(settings.dataset, settings.model)
    with strategy.scope():  # uint8 in; the model owns its cast, flip, colour jitter and normalization
        model = with_preprocessing(
            build_network(settings, data, replicas), normalization, model_augmentation(settings.dataset), settings.seed
        )
    info = ModelInfo(tuple(data.class_names), data.input_shape[0], data.resize_to, normalization, settings.dataset.name)
    log.info(
        "Model %s: %s parameters, input %s, lr %g <model=%s optimizer=%s>",
        model.name,
        f"{model.count_params():,}",
        data.input_shape,
        lr,
        settings.model.name,
        settings.optimizer.name,
    )

    output_dir = resolve_resume(settings.resume, settings.output_dir)
    run_name, tags = settings.name or Path(output_dir).name, list(settings.tags)
    log.info("Run %s, tags [%s] <name=%s tags=%s>", run_name, ", ".join(tags), settings.name, tags)
    class_weight = extensions.class_weight(settings, data)
    params = {key: value for key, value in loggers.flatten(settings).items() if key != "output_dir"}
    with (
        run_folder(output_dir, chief) as run_dir,
        folders.hold(run_dir) if chief else contextlib.nullcontext({}) as invocation,  # one writer per folder
        distribute.collective_errors(strategy),
        data.named_bad_records(),
        loggers.tracking(trackers, run_dir, run_name, tags, params, extensions.sweep_folder()),
    ):
        # A few training images for TensorBoard, read in order: no shuffle buffer to fill at start-up.
        sample_images = next(iter(data.train_plain.take(1)))[0][:8].numpy() if chief else None
        labels = [RunLabel(run_dir / "tensorboard", run_name, tags)] if settings.logger.tensorboard and chief else []
        backup_dir = backup_folder(run_dir, output_dir, None if chief else distribute.worker_name(strategy))
        for folder in (run_dir, run_dir / "checkpoints"):
            remove_temporaries(folder)  # left by a killed process; this one holds the folder
        done = prepare_resume(run_dir, backup_dir, settings.resume)
        if done > settings.trainer.epochs:
            raise ConfigError(f"resume={settings.resume}: {done} epochs are done already; raise trainer.epochs")
        started = time.perf_counter()
        plan = phases(settings)
        if done == settings.trainer.epochs:  # killed in the test evaluation: the final weights are in the backup
            log.info("All %d epochs are done: running the test evaluation the interrupted run missed", done)
            with strategy.scope():
                _compile(model, settings, lr * plan[-1].lr_scale, steps_per_epoch, plan[-1].end - plan[-1].start)
                restore_backup(model, backup_dir)  # builds the optimizer's variables: inside the scope
        switched_here = False  # a phase ended in this process and the next one starts here
        for phase in plan:
            if done >= phase.end:
                continue
            if isinstance(settings.model, VGG19ImageNetConfig):
                trainable = set_trainable(model, phase.unfreeze_from)
                log.info(
                    "Epochs %d-%d: %d base layers train, lr x %g <finetune.unfreeze_from=%s>",
                    phase.start + 1,
                    phase.end,
                    len(trainable),
                    phase.lr_scale,
                    phase.unfreeze_from,
                )
            with strategy.scope():
                _compile(model, settings, lr * phase.lr_scale, steps_per_epoch, phase.end - phase.start)
            if len(plan) > 1 and settings.optimizer.schedule.name != "constant":
                log.info(
                    "Epochs %d-%d: the %s schedule starts again from lr %g over these %d epochs "
                    "<optimizer.schedule.name=%s>",
                    phase.start + 1,
                    phase.end,
                    settings.optimizer.schedule.name,
                    lr * phase.lr_scale,
                    phase.end - phase.start,
                    settings.optimizer.schedule.name,
                )
            _log_xla(model, settings.trainer.jit_compile)
            callbacks = training_callbacks(
                run_dir,
                info,
                metric,
                settings.objective.mode,
                backup_dir,
                settings.trainer.save_every_steps,
                samples=sample_images,
                tensorboard=settings.logger.tensorboard,
                extra=[*extra_callbacks, *trackers, *labels],
                progress=chief and settings.trainer.verbose == 1 and sys.stderr.isatty(),
                title=_run_title(settings, output_dir),
            )
            if switched_here:
                # The backup holds the previous phase's optimizer; restoring it into this one would skip its
                # variables with a Keras warning. Back up the model as it stands, with this phase's optimizer.
                with strategy.scope():
                    model.optimizer.build(model.trainable_variables)
                backup = next(callback for callback in callbacks if isinstance(callback, RunBackup))
                backup.set_model(model)
                backup.save(phase.start)
            try:
                model.fit(
                    distribute.training_input(strategy, data.train, data.train_for_worker),
                    initial_epoch=max(done, phase.start),
                    epochs=phase.end,
                    steps_per_epoch=steps_per_epoch,
                    validation_data=data.val,
                    verbose=0,  # EpochLog prints the one line per epoch (and ProgressBar the bar)
                    callbacks=callbacks,
                    shuffle=False,  # the pipeline shuffles, seeded
                    class_weight=class_weight,
                )
                switched_here = True
            except Preempted as stop:
                log.warning(
                    "Stopped by SIGTERM: epoch %d will be redone from the backup in %s. To continue, "
                    "run: python run.py resume=%s",
                    stop.epoch + 1,
                    backup_dir,
                    run_dir,
                )
                invocation["outcome"] = "preempted"
                return None
            except DiskError as error:
                hint = f"Free space or fix permissions, then continue with: python run.py resume={run_dir}"
                raise DiskError(f"{error}. {hint}") from None
            if extensions.stopped_early(extra_callbacks):
                break  # no fine-tuning phase after an early stop
        seconds = time.perf_counter() - started
        history = read_history(run_dir / "history.csv")
        values = history[metric]
        best_epoch = values.index((max if settings.objective.mode == "max" else min)(values))

        test = evaluate_checkpoint(strategy, run_dir / "checkpoints" / "best.keras", data, "test", run_dir)
        metrics = {
            "name": run_name,
            "tags": tags,
            "objective": float(values[best_epoch]),
            "objective_metric": metric,
            "best_epoch": best_epoch + 1,
            "epochs_completed": len(values),
            "stopped_early": extensions.stopped_early(extra_callbacks),
            "val_accuracy": float(history["val_accuracy"][best_epoch]),
            "val_loss": float(history["val_loss"][best_epoch]),
            **{f"test_{name}": value for name, value in test.items() if name != "checkpoint"},
            "train_seconds": round(seconds, 2),
            "train_images_per_second": round((len(values) - done) * steps_per_epoch * batch / seconds, 1),
            "num_examples": data.num_examples,
            "num_replicas": replicas,
            "weights_sha256": weights_fingerprint(model),
        }
        write_json(run_dir / "metrics.json", metrics)
        remove_backup(backup_dir)  # only now: a kill before this resumes into the evaluation
        log.info(  # on every worker: the figures and weights must agree across workers
            "Test accuracy %.4f, test loss %.4f. Final weights sha256 %s",
            metrics["test_accuracy"],
            metrics["test_loss"],
            metrics["weights_sha256"],
        )
        for tracker in trackers:
            tracker.finish(metrics, [run_dir / artifact for artifact in extensions.ARTIFACTS], run_dir)
        if chief:
            log.info("%s", run_summary(run_dir, metrics))
    return metrics["objective"]
