"""Workaround: Keras 3's gradient accumulation under a `tf.distribute` strategy (TF backend).

Upstream: keras-team/keras#20582 (open; fix proposed in keras-team/keras#23592), seen with
Keras 3.15.1 and TensorFlow 2.21. `BaseOptimizer._backend_apply_gradients` chooses between
"update" and "accumulate" with `ops.cond` in the replica context, and the update branch
all-reduces the gradients (a `merge_call`). tf.distribute refuses a `merge_call` inside a
cond in a replica context, so `trainer.grad_accum_steps` under `strategy=mirrored` died in
the first step ("`merge_call` called while defining a new graph or a tf.function").

`accumulate_across_replicas(optimizer)` makes that one choice in the cross-replica context,
as Keras's own `LossScaleOptimizer` does for its finite-gradients cond: each branch runs
the replicas' own update or accumulation (`call_for_each_replica`), where the all-reduce
is allowed. The branches are Keras's own steps, in Keras's order; nothing else of the
optimizer changes. Each replica accumulates its own gradients and the update all-reduces
their sum, as one step of N x B examples would.

    python run.py strategy=mirrored trainer.grad_accum_steps=4

tests/test_training_options.py checks the update against one batch N times larger, and
that Keras alone still fails; once that test sees upstream fixed, delete this module.
"""

from __future__ import annotations

import types

import keras
import tensorflow as tf
from keras import ops


def _accumulators(optimizer: keras.optimizers.Optimizer, variables: list) -> list:
    return [optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables]


def _update(optimizer: keras.optimizers.Optimizer, grads: list, variables: list) -> None:
    """Keras's update branch: the mean of the accumulated and this step's gradients, clipped, applied."""
    steps = optimizer.gradient_accumulation_steps
    accumulators = _accumulators(optimizer, variables)
    grads = [(grad + accumulated) / steps for grad, accumulated in zip(grads, accumulators, strict=True)]
    grads = optimizer._clip_gradients(grads)
    optimizer._apply_weight_decay(variables)
    optimizer._backend_update_step(grads, variables, optimizer.learning_rate)
    optimizer._backend_reset_gradient_accumulators()


def _accumulate(optimizer: keras.optimizers.Optimizer, grads: list, variables: list) -> None:
    """Keras's other branch: add this step's gradients to the accumulators."""
    optimizer._backend_increment_gradient_accumulators(grads, _accumulators(optimizer, variables))


def _apply_gradients(optimizer: keras.optimizers.Optimizer, grads: list, variables: list) -> None:
    """`_backend_apply_gradients` with the update-or-accumulate cond in the cross-replica context."""

    def cross_replica(distribution, grads, variables):
        update = (optimizer._iterations + 1) % optimizer.gradient_accumulation_steps == 0
        ops.cond(
            update,
            lambda: distribution.extended.call_for_each_replica(_update, args=(optimizer, grads, variables)),
            lambda: distribution.extended.call_for_each_replica(_accumulate, args=(optimizer, grads, variables)),
        )

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(grads, variables))
    if optimizer.use_ema:  # as Keras does after its cond
        optimizer._update_model_variables_moving_average(optimizer._trainable_variables)


def accumulate_across_replicas(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """`optimizer`, accumulating gradients correctly under the current strategy (call inside its scope); unchanged
    where Keras's own code works (no strategy, no accumulation)."""
    if not optimizer.gradient_accumulation_steps or not tf.distribute.has_strategy():
        return optimizer
    original = optimizer._backend_apply_gradients

    def apply(self, grads, variables):
        if tf.distribute.in_cross_replica_context() or tf.__internal__.distribute.strategy_supports_no_merge_call():
            return original(grads, variables)
        return _apply_gradients(self, grads, variables)

    optimizer._backend_apply_gradients = types.MethodType(apply, optimizer)
    return optimizer
