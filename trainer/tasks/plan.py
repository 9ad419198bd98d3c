"""What a training run is made of, decided before anything trains: its phases, its plan and its folder; the
checks and log lines of the options that change what a step does.

    python run.py                                  # one phase: the whole network trains
    python run.py experiment=cats_dogs_finetune    # two: the head on a frozen base, then fine-tuning
    python run.py trainer.grad_accum_steps=4 optimizer.ema_momentum=0.999    # each logged, checked against the run

`trainer.tasks.train` makes the `Plan`, `trainer.tasks.holding` holds the `Folder`; `trainer.tasks.phases` fits
each `Phase` of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import keras
import tensorflow as tf

from trainer.config.schema import Config
from trainer.data.module import DataModule
from trainer.errors import ConfigError
from trainer.runs.storage import OutputFolders
from trainer.tracking import loggers
from trainer.training.optimizers import fitted_warmup

log = logging.getLogger(__name__)

EMA_START_LEFT = 0.05  # an EMA that still holds more of the initial weights than this at the end is warned about


@dataclass(frozen=True)
class Phase:
    """Epochs [start, end) trained with the base unfrozen from `unfreeze_from`, at lr x `lr_scale`."""

    start: int
    end: int
    unfreeze_from: str | None  # None: the whole base frozen; "all": nothing frozen
    lr_scale: float


def fine_tunes(settings: Config) -> bool:
    """Whether the run trains in fine-tuning's phases: a pretrained base (`model=vgg19_imagenet`), or a run's
    weights (`model.init_from`) with `finetune.freeze_epochs` of the head alone first."""
    return settings.model.PRETRAINED_BASE or bool(settings.model.init_from and settings.finetune.freeze_epochs)


def phases(settings: Config) -> list[Phase]:
    """One phase for a model trained from scratch (or on from a run's weights); for a pretrained base, the head
    first, then fine-tuning."""
    epochs = settings.trainer.epochs
    if not fine_tunes(settings):
        return [Phase(0, epochs, "all", 1.0)]
    tune = settings.finetune
    freeze = min(tune.freeze_epochs, epochs)
    second = [Phase(freeze, epochs, tune.unfreeze_from, tune.lr_multiplier)] if freeze < epochs else []
    return ([Phase(0, freeze, None, 1.0)] if freeze else []) + second


@dataclass
class LateChecks:
    """Start-up checks that the first training step need not wait for, as they guard only what comes after it
    (the report at the end). Each runs once: after the first training step, before anything of the run is saved
    (`trainer.training.callbacks.AfterFirstStep`), else before the test evaluation (a resumed run with every
    epoch done trains no step). A failed one stops the run with its one line, as it would before the step."""

    checks: list[Callable[[], None]] = field(default_factory=list)

    def run(self) -> None:
        while self.checks:
            self.checks.pop(0)()


@dataclass
class Plan:
    """What a run will do, decided before anything is built: its folder, trackers, data, steps, rate, phases."""

    strategy: tf.distribute.Strategy
    chief: bool
    output_dir: str  # the run folder: Hydra's new one, or the resumed run's
    trackers: list[loggers.Tracker]  # MLflow, W&B (the chief's), connected
    tensorboard: list[keras.callbacks.Callback]  # logger=tensorboard (the chief's)
    data: DataModule
    steps_per_epoch: int
    lr: float  # the peak rate, after linear scaling
    phases: list[Phase]
    metric: str  # objective.metric
    tensorboard_dir: str = ""  # where logger=tensorboard writes (`trainer.tasks.train.tensorboard_dir`)
    outputs: OutputFolders = field(default_factory=OutputFolders)  # Vertex AI's folders (the chief's)
    started: float = field(default_factory=time.monotonic)  # trainer.time_budget counts from here
    late_checks: LateChecks = field(default_factory=LateChecks)  # run after the first step (`LateChecks`)
    prune_metric: str = ""  # what a search's pruner is told each epoch (`train._prune_metric`: set by plan_run)


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
    steps: int = 0  # steps of epoch done + 1 trained before this process started (a backup made within it)


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
    if schedule.warms_up and schedule.warmup_epochs >= epochs:
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
