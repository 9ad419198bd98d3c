"""Every worker of a multi-worker run trains from the chief's state: its epochs done and its restored variables.

Only the chief keeps a backup that outlives the process (in the run folder); every other worker's
folder is a fresh temporary one on each start. So a resumed worker learns from the chief how far the
run got, and takes the chief's weights, optimizer state and random layers' seeds after the restore,
instead of training other weights than the chief from epoch 1 (the all-reduce would have summed the
gradients of two different models, silently).

And a stop that one worker was asked for (SIGTERM, Ctrl-C) is every worker's stop, at the same step:
each saves at that step's end instead of one waiting in the next step's all-reduce for a peer gone.

Each runs a collective: every worker must call them at the same point, in the same order.
Outside multi-worker runs they return at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import keras
import tensorflow as tf

from trainer.distribute.topology import in_multi_worker_mode

_SUMMABLE = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def _chief_only(value: tf.Tensor) -> tf.Tensor:
    """`value` on the first replica (the chief's: collectives order the chief's replicas first), zeros elsewhere,
    in a type the collectives can sum exactly."""
    if value.dtype not in _SUMMABLE:
        value = tf.cast(value, tf.int64 if value.dtype.is_integer or value.dtype == tf.bool else tf.float32)
    first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
    return tf.where(first, value, tf.zeros_like(value))


def _from_first_replica(strategy: tf.distribute.Strategy, read) -> list[tf.Tensor]:
    """The tensors `read()` gives on the chief's first replica, on every worker (a sum in which only it counts)."""
    per_replica = strategy.run(lambda: [_chief_only(tf.convert_to_tensor(value)) for value in read()])
    return [strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for value in per_replica]


def chief_numbers(strategy: tf.distribute.Strategy, numbers: Sequence[int]) -> list[int]:
    """The chief's `numbers` on every worker (the worker's own outside multi-worker runs)."""
    if not in_multi_worker_mode(strategy):
        return list(numbers)
    with strategy.scope():
        constants = lambda: [tf.constant(number, tf.int64) for number in numbers]  # noqa: E731
        values = tf.function(lambda: _from_first_replica(strategy, constants))()
    return [int(value) for value in values]


def take_chief_variables(strategy: tf.distribute.Strategy, variables: Sequence[tf.Variable]) -> None:
    """Assigns the chief's values of `variables` (the same list, in the same order, on every worker) to every
    worker's copy; metrics' variables (read-synchronized) are left out: each epoch resets them."""
    if not in_multi_worker_mode(strategy):
        return
    kept = [variable for variable in variables if variable.synchronization != "on_read"]  # Keras's name

    def assign() -> None:
        values = _from_first_replica(strategy, lambda: [variable.value for variable in kept])
        for variable, value in zip(kept, values, strict=True):
            variable.assign(tf.cast(value, variable.dtype))

    with strategy.scope():
        tf.function(assign)()


@functools.cache
def _count_fn(strategy: tf.distribute.Strategy):
    """One traced function per strategy: the sum over replicas of each replica's worker's flag."""

    def count(flag: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flag)), axis=None)

    return tf.function(count)


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether `flag` is true on some worker (this worker's `flag` outside multi-worker runs)."""
    if not in_multi_worker_mode(strategy):
        return flag
    with strategy.scope():
        return int(_count_fn(strategy)(tf.constant(int(flag), tf.int64))) > 0


@dataclass(frozen=True)
class Workers:
    """The agreements a run's callbacks make with the other workers (each a no-op outside multi-worker runs)."""

    strategy: tf.distribute.Strategy

    def take_chief_state(self, model: keras.Model) -> None:
        """The model's weights, optimizer state and random layers' seeds become the chief's."""
        take_chief_variables(self.strategy, [*model.variables, *model.optimizer.variables])

    def any_stop(self, requested: bool) -> bool:
        """Whether some worker was asked to stop (all workers answer alike, at the same step)."""
        return any_worker(self.strategy, requested)
