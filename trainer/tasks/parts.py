"""The optional parts of a training run, built from their `_target_`: callbacks, trackers; and class weights.

    python run.py logger=[tensorboard,mlflow] callbacks=early_stopping trainer.class_weight=balanced
    python run.py +callbacks.csv._target_=keras.callbacks.CSVLogger +callbacks.csv.filename=log.csv

Each chosen entry of `callbacks` and `logger` that has a `_target_` is built with
`hydra.utils.instantiate`, as lightning-hydra-template's `instantiate_callbacks` and
`instantiate_loggers` do; what only the run knows (the TensorBoard folder) is passed then.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import keras

from trainer.config.schema import CallbacksConfig, Config, LoggerConfig
from trainer.data.mixing import with_class_weights
from trainer.errors import ConfigError
from trainer.evaluation.report import FILES as REPORT_FILES
from trainer.models.targets import build_target
from trainer.tasks.data import Data
from trainer.tracking.loggers import MLflowTracker, Tracker
from trainer.training.losses import class_weights, count_labels
from trainer.training.optimizers import fitted_warmup

log = logging.getLogger(__name__)

ARTIFACTS = (
    "metrics.json",
    "history.csv",
    "curves.png",
    "confusion_matrix_test.png",
    "confusion_matrix_test.csv",
    "config_tree.txt",
    ".hydra/config.yaml",
    "checkpoints/best.keras",
    *(f"report/{name}" for name in REPORT_FILES),  # evaluate.report
)


def class_figures(per_class: dict[str, dict]) -> dict[str, float]:
    """Each class's test F1 as a tracker metric, `test_f1/NAME` (a name's characters MLflow refuses as `_`)."""
    return {f"test_f1/{re.sub(r'[^A-Za-z0-9_. -]', '_', name)}": row["f1"] for name, row in per_class.items()}


def _entries(section: Any) -> dict[str, dict[str, Any]]:
    """{name: options} of every entry of a config section that names a `_target_` (None entries are off)."""
    found = {}
    for name, value in vars(section).items():
        if dataclasses.is_dataclass(value):
            value = {item.name: getattr(value, item.name) for item in dataclasses.fields(value)}
        if isinstance(value, dict) and "_target_" in value:
            found[name] = value
        elif isinstance(value, dict):  # the open part of a section: `extra` holds the user's own entries
            found.update(
                {key: entry for key, entry in value.items() if isinstance(entry, dict) and "_target_" in entry}
            )
    return found


def _build(key: str, options: dict[str, Any], **runtime: Any) -> Any:
    rest = {name: value for name, value in options.items() if name != "_target_"}
    return build_target(key, options["_target_"], rest, **runtime)


EMA_START_LEFT = 0.05  # an EMA that still holds more of the initial weights than this at the end is warned about


def build_callbacks(callbacks: CallbacksConfig, schedule: str, validate: bool = True) -> list[keras.callbacks.Callback]:
    """Every callback `callbacks=` chose (early stopping, LR on plateau, your own), built from its `_target_`.

    Raises:
        ConfigError: reduce_lr_on_plateau with a schedule that sets the rate every step; a target that is
            not a Keras callback; a callback that monitors a `val_` metric when `trainer.validate=false`
            leaves none (Keras would only warn, every epoch, and never act).
    """
    if callbacks.reduce_lr_on_plateau is not None and schedule != "constant":
        raise ConfigError(
            f"callbacks=reduce_lr_on_plateau needs optimizer.schedule.name=constant (the {schedule} schedule sets "
            f"the rate every step); got {schedule}"
        )
    built = []
    for name, options in _entries(callbacks).items():
        callback = _build(f"callbacks.{name}", options)
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(f"callbacks.{name}._target_={options['_target_']} must be a Keras callback")
        monitor = getattr(callback, "monitor", None)
        if not validate and isinstance(monitor, str) and monitor.startswith("val_"):
            raise ConfigError(
                f"callbacks.{name}.monitor={monitor}: trainer.validate=false leaves no validation metrics; monitor "
                f"{monitor.removeprefix('val_')} or validate in fit"
            )
        built.append(callback)
    return built


def build_trackers(logger: LoggerConfig, run_dir: Path) -> tuple[list[Tracker], list[keras.callbacks.Callback]]:
    """(experiment trackers, other logging callbacks) that `logger=` chose, the trackers connected (a server
    that cannot be reached fails here, before any data is read). TensorBoard writes into `run_dir/tensorboard`."""
    trackers, others = [], []
    for name, options in _entries(logger).items():
        runtime = {"log_dir": str(run_dir / "tensorboard")} if name == "tensorboard" else {}
        part = _build(f"logger.{name}", options, **runtime)
        if isinstance(part, Tracker):
            part.connect()
            if isinstance(part, MLflowTracker):  # best.keras as an MLflow Model that serves files and pixels
                from trainer.serving.mlflow_model import log_model

                part.model_logger = log_model
            trackers.append(part)
        elif isinstance(part, keras.callbacks.Callback):
            others.append(part)
        else:
            raise ConfigError(f"logger.{name}._target_={options['_target_']} must be a Keras callback")
    return trackers, others


def check_updates(settings: Config, steps_per_epoch: int) -> None:
    """Refuses a run that would never update the model; warns where a warm-up or an average cannot fit the run.

    Raises:
        ConfigError: `trainer.grad_accum_steps` is more than the steps of the whole run.
    """
    epochs, accumulate = settings.trainer.epochs, settings.trainer.grad_accum_steps
    steps = steps_per_epoch * epochs
    if accumulate > steps:
        raise ConfigError(
            f"trainer.grad_accum_steps={accumulate} is more than the {steps} steps of the whole run "
            f"({steps_per_epoch} per epoch x trainer.epochs={epochs}): the model would never be updated; "
            f"use at most {steps}"
        )
    schedule = settings.optimizer.schedule
    if schedule.name == "cosine" and schedule.warmup_epochs >= epochs:
        log.warning(
            "optimizer.schedule.warmup_epochs=%g is not shorter than trainer.epochs=%d: warming up over %g "
            "epoch(s) instead, a tenth of the run, so that the rate reaches its peak",
            schedule.warmup_epochs,
            epochs,
            fitted_warmup(schedule.warmup_epochs, epochs),
        )
    momentum, updates = settings.optimizer.ema_momentum, steps // accumulate
    if momentum is not None and momentum**updates > EMA_START_LEFT:
        log.warning(
            "The run makes %d updates, and an EMA of momentum %g still holds %.0f%% of the initial weights after "
            "them: the averaged weights (validated, saved and exported) stay close to the untrained model; "
            "train longer or lower the momentum (%.4g forgets the start in this run) <optimizer.ema_momentum=%g>",
            updates,
            momentum,
            100 * momentum**updates,
            EMA_START_LEFT ** (1 / updates),
            momentum,
        )


def log_training_options(settings: Config, steps_per_epoch: int) -> None:
    """One line for each option that changes what a step does: gradient accumulation, EMA, MixUp/CutMix."""
    accumulate, batch = settings.trainer.grad_accum_steps, settings.trainer.batch_size
    if accumulate > 1:
        log.info(
            "Effective global batch %d = %d accumulated batches x %d: one update every %d steps, %d updates "
            "per epoch <trainer.grad_accum_steps=%d>",
            accumulate * batch,
            accumulate,
            batch,
            accumulate,
            steps_per_epoch // accumulate,
            accumulate,
        )
        if steps_per_epoch % accumulate:
            log.warning(
                "%d steps per epoch are not a multiple of trainer.grad_accum_steps=%d: updates straddle epochs",
                steps_per_epoch,
                accumulate,
            )
    momentum = settings.optimizer.ema_momentum
    if momentum is not None:
        log.info(
            "EMA of the weights (momentum %g): validation, the checkpoints, the test evaluation and the export "
            "use the averaged weights <optimizer.ema_momentum=%g>",
            momentum,
            momentum,
        )
    augment, smoothing = settings.dataset.augment, settings.trainer.label_smoothing
    if augment.mixing:
        both = augment.mixup_alpha and augment.cutmix_alpha
        log.info(
            "MixUp alpha %g, CutMix alpha %g: %g of the images mixed%s, labels one-hot and mixed with them%s "
            "<dataset.augment.mixup_alpha=%g dataset.augment.cutmix_alpha=%g>",
            augment.mixup_alpha,
            augment.cutmix_alpha,
            augment.mix_prob,
            f", CutMix for {augment.mix_switch_prob:g} of those" if both else "",
            f", smoothed by {smoothing:g}" if smoothing else "",
            augment.mixup_alpha,
            augment.cutmix_alpha,
        )


def stopped_early(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether an EarlyStopping among `callbacks` ended the last `fit` early."""
    return any(isinstance(item, keras.callbacks.EarlyStopping) and item.stopped_epoch > 0 for item in callbacks)


def weighted_training_data(settings: Config, data: Data, weights: dict[int, float] | None, start_batch: int = 0):
    """(the training dataset from batch `start_batch` of its stream on, its per-worker builder, fit's
    `class_weight`): with MixUp or CutMix, class weights become each image's sample weight in the pipeline (its
    soft label's weighted mean), not `class_weight`, which would weigh a soft label by its largest share alone."""
    train, for_worker = data.train_from(start_batch) if start_batch else (data.train, data.train_for_worker)
    if weights is None or not settings.dataset.augment.mixing:
        return train, for_worker, weights
    train = with_class_weights(train, weights)
    if for_worker is not None:
        build = for_worker
        for_worker = lambda context: with_class_weights(build(context), weights)  # noqa: E731
    return train, for_worker, None


def class_weight(settings: Config, data: Data) -> dict[int, float] | None:
    """`trainer.class_weight` as fit's argument; `balanced` counts the training split (manifest, else the data)."""
    option = settings.trainer.class_weight
    counts = None
    if option == "balanced":
        known = (data.class_counts or {}).get("train")
        if known and set(known) == set(data.class_names):
            counts = [int(known[name]) for name in data.class_names]
        else:
            counts = count_labels(data.train_plain, len(data.class_names))
    weights = class_weights(option, counts, len(data.class_names))
    if weights is not None:
        shown = ", ".join(f"{index}: {weight:.3g}" for index, weight in weights.items())
        log.info("Class weights {%s} <trainer.class_weight=%s>", shown, "balanced" if option == "balanced" else "{...}")
    return weights
