"""Every worker of a multi-worker run trains from the chief's state: its epochs done and its restored variables.

Only the chief keeps a backup that outlives the process (in the run folder); every other worker's
folder is a fresh temporary one on each start. So a resumed worker learns from the chief how far the
run got, and takes the chief's weights, optimizer state and random layers' seeds after the restore,
instead of training other weights than the chief from epoch 1 (the all-reduce would have summed the
gradients of two different models, silently).

Both run a collective: every worker must call them at the same point, in the same order.
Outside multi-worker runs they return at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from trainer.distribute.strategies import in_multi_worker_mode

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
