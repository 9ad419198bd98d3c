"""Distribution strategies by name: `strategy=single` builds a `tf.distribute.Strategy`.

    python run.py strategy=single strategy.device=/gpu:1

New strategies register a builder in `STRATEGIES`; the task code only ever
sees a `tf.distribute.Strategy` and its `num_replicas_in_sync`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from trainer.errors import ConfigError

log = logging.getLogger(__name__)


def single(device: str | None = None) -> tf.distribute.Strategy:
    """One device: `device` if given, else the first GPU, else the CPU."""
    if device is None:
        gpus = tf.config.list_logical_devices("GPU")
        device = gpus[0].name if gpus else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


STRATEGIES: dict[str, Callable[..., tf.distribute.Strategy]] = {"single": single}


def build_strategy(name: str, **options) -> tf.distribute.Strategy:
    """Builds the strategy `name` with its own options.

    Raises:
        ConfigError: `name` is not a known strategy.
    """
    if name not in STRATEGIES:
        raise ConfigError(f"strategy.name must be one of {sorted(STRATEGIES)}; got {name!r}")
    strategy = STRATEGIES[name](**options)
    log.info(
        "Strategy %s with %d replica(s) <strategy=%s>", type(strategy).__name__, strategy.num_replicas_in_sync, name
    )
    return strategy


def per_replica_batch(global_batch: int, strategy: tf.distribute.Strategy) -> int:
    """The batch each replica sees; the global batch must split evenly.

    Raises:
        ConfigError: `global_batch` is not divisible by the number of replicas.
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch % replicas:
        raise ConfigError(
            f"trainer.batch_size={global_batch} must be divisible by the {replicas} replicas of the strategy"
        )
    return global_batch // replicas
