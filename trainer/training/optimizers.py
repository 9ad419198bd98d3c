"""Optimizers (a Keras class named by `optimizer._target_`) and learning-rate schedules (one function per
`optimizer.schedule.name`, which its schema names as its target: `trainer.config.groups.ScheduleConfig.target`).

python run.py optimizer=sgd optimizer.lr=0.05 optimizer.schedule.name=cosine
python run.py optimizer=adam optimizer._target_=keras.optimizers.Nadam    # any Keras optimizer with Adam's keys
"""

from __future__ import annotations

from typing import Any

import keras

from trainer.distribute.failures import is_peer_failure
from trainer.targets import build_target


def constant(lr: float, steps_per_epoch: int, epochs: int, **_) -> float:
    """The same learning rate for the whole run."""
    return lr


def step(lr: float, steps_per_epoch: int, epochs: int, boundaries=(), factor: float = 0.1, **_):
    """Multiplies the learning rate by `factor` at each boundary (given in epochs)."""
    if not boundaries:
        return lr
    steps = [int(round(epoch * steps_per_epoch)) for epoch in boundaries]
    values = [lr * factor**index for index in range(len(steps) + 1)]
    return keras.optimizers.schedules.PiecewiseConstantDecay(steps, values)


WARMUP_SHARE = 0.1  # a warm-up as long as the run or longer is cut to this share of it


def fitted_warmup(warmup_epochs: float, epochs: int) -> float:
    """The warm-up a run of `epochs` gets: `warmup_epochs`, or a tenth of the run when that is not shorter than
    the run (a preset's 5 epochs on a 4-epoch trial would never reach its peak rate)."""
    return warmup_epochs if warmup_epochs < epochs else WARMUP_SHARE * epochs


def cosine(lr: float, steps_per_epoch: int, epochs: int, warmup_epochs: float = 0.0, alpha: float = 0.0, **_):
    """Linear warmup from 0 to `lr` over `warmup_epochs` (`fitted_warmup`), then cosine decay to `alpha * lr`."""
    total = max(1, epochs * steps_per_epoch)
    warmup = min(int(round(fitted_warmup(warmup_epochs, epochs) * steps_per_epoch)), total - 1)
    if warmup == 0:
        return keras.optimizers.schedules.CosineDecay(lr, total, alpha=alpha)
    return keras.optimizers.schedules.CosineDecay(
        0.0,
        total - warmup,
        alpha=alpha,
        warmup_target=lr,
        warmup_steps=warmup,
    )


def peak_learning_rate(
    lr: float, batch_size: int, lr_batch_size: int | None = None, replicas: int = 1, scale_with_replicas: bool = False
) -> float:
    """The peak rate a run trains at: `lr` scaled by the linear scaling rule (Goyal et al. 2017).

    Args:
        lr: The configured rate.
        batch_size: The global batch size of this run.
        lr_batch_size: The global batch `lr` is tuned for; the rate scales by `batch_size / lr_batch_size`
            (SGD at 0.1 is tuned for batch 128 and diverges at batch 32). None: `lr` as given.
        replicas: Replicas in sync.
        scale_with_replicas: `lr` is per replica: multiply it by `replicas`.
    """
    if lr_batch_size:
        return lr * batch_size / lr_batch_size
    return lr * (replicas if scale_with_replicas else 1)


def build_learning_rate(target: str, lr: float, steps_per_epoch: int, epochs: int, **options):
    """A float or a `keras.optimizers.schedules.LearningRateSchedule`, stepping once per batch.

    Args:
        target: The schedule's function (`optimizer.schedule`'s target): `trainer.training.optimizers.constant`,
            `.step` or `.cosine`.
        lr: Peak learning rate.
        steps_per_epoch: Optimizer steps in one epoch.
        epochs: Length of the run, for the cosine schedule.
        **options: The schedule's own settings (boundaries, factor, warmup_epochs, alpha).

    Raises:
        ConfigError: naming `optimizer.schedule`, for a target that cannot be called with these keys.
    """
    runtime = {"lr": lr, "steps_per_epoch": steps_per_epoch, "epochs": epochs}
    return build_target("optimizer.schedule", target, options, **runtime)


def build_optimizer(target: str, learning_rate, options: dict[str, Any]) -> keras.optimizers.Optimizer:
    """The Keras optimizer `target` (e.g. `keras.optimizers.SGD`) at `learning_rate` (a float or a schedule), with
    the option's own keyword arguments (momentum, clipnorm, weight_decay...).

    Raises:
        ConfigError: the class cannot be imported or does not take these keys.
    """
    # its variables are broadcast from the chief: a lost peer is no fault of optimizer._target_
    optimizer = build_target("optimizer", target, options, passes=is_peer_failure, learning_rate=learning_rate)

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"optimizer._target_={target} must be a Keras optimizer; got {type(optimizer).__name__}")
    return optimizer
