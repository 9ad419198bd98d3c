"""The optional parts of a training run, built from their `_target_`: callbacks and trackers.

    python run.py logger=[tensorboard,mlflow] callbacks=early_stopping
    python run.py +callbacks.csv._target_=keras.callbacks.CSVLogger +callbacks.csv.filename=log.csv

Each chosen entry of `callbacks` and `logger` that has a `_target_` is built with
`hydra.utils.instantiate`, as lightning-hydra-template's `instantiate_callbacks` and
`instantiate_loggers` do; what only the run knows (the TensorBoard folder) is passed then.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import keras

from trainer.config.groups import ScheduleConfig
from trainer.config.schema import CallbacksConfig, LoggerConfig
from trainer.errors import ConfigError
from trainer.evaluation.report import FILES as REPORT_FILES
from trainer.targets import build_target
from trainer.tracking.loggers import MLflowTracker, Tracker

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


def build_callbacks(
    callbacks: CallbacksConfig, schedule: ScheduleConfig, validate: bool = True
) -> list[keras.callbacks.Callback]:
    """Every callback `callbacks=` chose (early stopping, LR on plateau, your own), built from its `_target_`.

    Raises:
        ConfigError: reduce_lr_on_plateau with a schedule that sets the rate every step; a target that is
            not a Keras callback; a callback that monitors a `val_` metric when `trainer.validate=false`
            leaves none (Keras would only warn, every epoch, and never act).
    """
    if callbacks.reduce_lr_on_plateau is not None and schedule.steps_the_rate:
        raise ConfigError(
            f"callbacks=reduce_lr_on_plateau needs optimizer.schedule.name=constant (the {schedule.name} schedule "
            f"sets the rate every step); got {schedule.name}"
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


def build_trackers(
    logger: LoggerConfig, tensorboard_dir: str | os.PathLike
) -> tuple[list[Tracker], list[keras.callbacks.Callback]]:
    """(experiment trackers, other logging callbacks) that `logger=` chose, the trackers connected (a server
    that cannot be reached fails here, before any data is read). TensorBoard writes into `tensorboard_dir`
    (`trainer.tasks.train.tensorboard_dir`: the run's, or the one given)."""
    trackers, others = [], []
    for name, options in _entries(logger).items():
        if name == "tensorboard":
            options = {key: value for key, value in options.items() if key != "log_dir"}
        runtime = {"log_dir": os.fspath(tensorboard_dir)} if name == "tensorboard" else {}
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


def stopped_early(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether an EarlyStopping among `callbacks` ended the last `fit` early."""
    return any(isinstance(item, keras.callbacks.EarlyStopping) and item.stopped_epoch > 0 for item in callbacks)
