"""The optional parts of a training run, from the config: experiment trackers, plateau callbacks, class weights.

python run.py logger=mlflow callbacks=early_stopping trainer.class_weight=balanced
"""

from __future__ import annotations

import logging
from pathlib import Path

import keras

from trainer import loggers
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.loss_options import class_weights, count_labels
from trainer.tasks.data import Data

log = logging.getLogger(__name__)


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


def plateau_callbacks(settings: Config) -> list[keras.callbacks.Callback]:
    """`callbacks=early_stopping` and `callbacks=reduce_lr_on_plateau`, as Keras callbacks."""
    chosen: list[keras.callbacks.Callback] = []
    stop, reduce = settings.callbacks.early_stopping, settings.callbacks.reduce_lr_on_plateau
    if stop is not None:
        chosen.append(
            keras.callbacks.EarlyStopping(
                monitor=stop.monitor,
                mode=stop.mode,
                patience=stop.patience,
                min_delta=stop.min_delta,
                restore_best_weights=stop.restore_best_weights,
            )
        )
    if reduce is not None:
        if settings.optimizer.schedule.name != "constant":
            raise ConfigError(
                "callbacks=reduce_lr_on_plateau needs optimizer.schedule.name=constant (the "
                f"{settings.optimizer.schedule.name} schedule sets the rate every step); got "
                f"{settings.optimizer.schedule.name}"
            )
        chosen.append(
            keras.callbacks.ReduceLROnPlateau(
                monitor=reduce.monitor,
                mode=reduce.mode,
                factor=reduce.factor,
                patience=reduce.patience,
                min_delta=reduce.min_delta,
                min_lr=reduce.min_lr,
            )
        )
    return chosen


def sweep_folder() -> Path | None:
    """The sweep folder when Hydra runs this job as part of a multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    return Path(hydra.runtime.output_dir).parents[len(Path(str(hydra.sweep.subdir)).parts) - 1]


def trackers(settings: Config) -> list[loggers.Tracker]:
    """MLflow and W&B trackers as `logger=` asks, connected (an unreachable server fails here)."""
    options = settings.logger
    return loggers.create(
        options.mlflow,
        options.wandb,
        options.experiment,
        options.tracking_uri,
        options.wandb_mode,
        options.wandb_entity,
        options.timeout_seconds,
    )


def stopped_early(callbacks: list[keras.callbacks.Callback]) -> bool:
    """Whether an EarlyStopping among `callbacks` ended the last `fit` early."""
    return any(isinstance(item, keras.callbacks.EarlyStopping) and item.stopped_epoch > 0 for item in callbacks)


ARTIFACTS = (
    "metrics.json",
    "history.csv",
    "curves.png",
    "confusion_matrix_test.png",
    "confusion_matrix_test.csv",
    "config_tree.txt",
    ".hydra/config.yaml",
    "checkpoints/best.keras",
)
