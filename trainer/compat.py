"""Workaround: Keras 3 `fit`/`evaluate` under `MultiWorkerMirroredStrategy` (TF backend).

Upstream bugs: tensorflow/tensorflow#72388 and keras-team/keras#20585, seen
with Keras 3.15.1 and TensorFlow 2.21. Two places in
`keras/src/backend/tensorflow/trainer.py` fail only in multi-worker mode:

1. `_maybe_symbolic_build` runs eagerly before the first step and calls
   `strategy.reduce("MEAN", batch)` on the `PerReplica` input batch just to
   learn its shapes. The multi-worker reduce cannot convert a `PerReplica`
   to a tensor, so `fit` dies before training. The build needs only shapes,
   so this module hands it the local replica's batch instead: no collective,
   same shapes.
2. `reduce_per_replica(..., reduction="mean")` calls
   `strategy.reduce("MEAN", value, axis=0)` on every step output, but the
   outputs are scalar metrics, which have no axis 0. This module reduces
   scalars with `axis=None` (the mean over replicas, as single-worker
   mirroring does) and leaves everything else to the original.

`apply()` is called only when `strategy=multi_worker` is built. It patches
nothing outside the Keras versions below; remove this module once upstream
fixes both places (the multi-worker test fails without it).

    python run.py strategy=multi_worker   # see README "Multi-worker training"
"""

from __future__ import annotations

import logging

import keras

log = logging.getLogger(__name__)

AFFECTED = ((3, 0), (4, 0))  # [first, last) Keras versions with the bug; 3.15.1 verified
_applied = False


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _multi_worker(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    )


def apply() -> bool:
    """Patches Keras's TF trainer for multi-worker `fit`; returns whether it did."""
    global _applied
    if _applied:
        return True
    if not AFFECTED[0] <= _version(keras.__version__) < AFFECTED[1] or keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original_build = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = tf_trainer.reduce_per_replica

    def local_batch(strategy, batch):
        def first(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        return tree.map_structure(first, batch)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None or not _multi_worker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, step_iterator in iterator:  # the upstream code takes the first batch the same way
            data_batch = local_batch(strategy, next(step_iterator))
            break
        return original_build(self, iterator=None, data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _multi_worker(strategy):
            return original_reduce(values, strategy, reduction)

        def mean(value):
            axis = None if value.shape.rank == 0 else 0
            return strategy.reduce("MEAN", value, axis=axis)

        return tree.map_structure(mean, values)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica
    _applied = True
    log.info("Applied the Keras %s multi-worker fit workaround (keras#20585)", keras.__version__)
    return True
