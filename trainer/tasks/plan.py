"""What a training run is made of, decided before anything trains: its phases, its plan and its folder.

    python run.py                                  # one phase: the whole network trains
    python run.py experiment=cats_dogs_finetune    # two: the head on a frozen base, then fine-tuning

`trainer.tasks.train` makes the `Plan` and holds the `Folder`; `trainer.tasks.phases` fits
each `Phase` of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import keras
import tensorflow as tf

from trainer.config.schema import Config
from trainer.tasks.data import Data
from trainer.tracking import loggers


@dataclass(frozen=True)
class Phase:
    """Epochs [start, end) trained with the base unfrozen from `unfreeze_from`, at lr x `lr_scale`."""

    start: int
    end: int
    unfreeze_from: str | None  # None: the whole base frozen; "all": nothing frozen
    lr_scale: float


def phases(settings: Config) -> list[Phase]:
    """One phase for a model trained from scratch; for a pretrained base, the head first, then fine-tuning."""
    epochs = settings.trainer.epochs
    if not settings.model.PRETRAINED_BASE:
        return [Phase(0, epochs, "all", 1.0)]
    tune = settings.finetune
    freeze = min(tune.freeze_epochs, epochs)
    second = [Phase(freeze, epochs, tune.unfreeze_from, tune.lr_multiplier)] if freeze < epochs else []
    return ([Phase(0, freeze, None, 1.0)] if freeze else []) + second


@dataclass
class Plan:
    """What a run will do, decided before anything is built: its folder, trackers, data, steps, rate, phases."""

    strategy: tf.distribute.Strategy
    chief: bool
    output_dir: str  # the run folder: Hydra's new one, or the resumed run's
    trackers: list[loggers.Tracker]  # MLflow, W&B (the chief's), connected
    tensorboard: list[keras.callbacks.Callback]  # logger=tensorboard (the chief's)
    data: Data
    steps_per_epoch: int
    lr: float  # the peak rate, after linear scaling
    phases: list[Phase]
    metric: str  # objective.metric
    started: float = field(default_factory=time.monotonic)  # trainer.time_budget counts from here


@dataclass
class Folder:
    """The run folder while this process holds it: where it writes, its backup, and what is done already."""

    run_dir: Path
    backup_dir: Path
    done: int  # epochs finished before this process started
    ended: str  # `stopped_early` when training had ended already (killed in the test evaluation), else empty
    invocation: dict  # this invocation's record in invocations.jsonl (its `outcome`)
    run_name: str
    tags: list[str] = field(default_factory=list)
    gate: keras.callbacks.Callback | None = None  # the whole-file data check at the first epoch end (the chief's)
