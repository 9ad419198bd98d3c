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

`apply()` is called only when `strategy=multi_worker` is built. It patches only
the Keras versions in `VERIFIED`. On any other version it first probes the
upstream code (`upstream_bugs`, no cluster needed): if both bugs are gone, nothing
is patched; if one is still there, the run stops with a clear error instead of
patching code nobody checked. tests/test_compat.py runs the same probe and fails
once upstream fixes the bugs: then delete this module.

    python run.py strategy=multi_worker   # see docs/distributed.md, "Multi-worker training"
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from unittest import mock

import keras

from trainer.distribute.topology import in_multi_worker_mode
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

VERIFIED = ("3.15.1",)  # Keras versions this patch was checked on (2 loopback workers train and agree)
_applied = False
_originals: dict = {}


class _Recorder:
    """A stand-in strategy that records its `reduce` calls (the probes never run a collective)."""

    def __init__(self):
        self.calls = []

    def reduce(self, op, value, axis=None):
        self.calls.append(axis)
        return value

    def scope(self):
        return mock.MagicMock()


def upstream_bugs() -> list[str]:
    """Which of the two upstream bugs Keras's TF trainer still has, probed on its own (unpatched) code.

    - `build`: `_maybe_symbolic_build` all-reduces the first distributed input batch to learn its shapes;
    - `scalar_axis`: multi-worker `reduce_per_replica(..., "mean")` reduces scalars along axis 0.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from tensorflow.python.distribute.values import PerReplica

    build = _originals.get("build", tf_trainer.TensorFlowTrainer._maybe_symbolic_build)
    reduce = _originals.get("reduce", tf_trainer.reduce_per_replica)
    found = []

    strategy = _Recorder()
    model = SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy, _symbolic_build=lambda **_: 0)
    batch = PerReplica([tf.constant([1.0])])
    build(model, iterator=[(0, 0, iter([batch]))])
    if strategy.calls:
        found.append("build")

    strategy = _Recorder()
    with mock.patch.object(tf_trainer, "_collective_all_reduce_multi_worker", return_value=True):
        reduce(tf.constant(1.0), strategy, "mean")
    if 0 in strategy.calls:
        found.append("scalar_axis")
    return found


def apply() -> bool:
    """Patches Keras's TF trainer for multi-worker `fit`; returns whether it did."""
    global _applied
    if _applied:
        return True
    if keras.backend.backend() != "tensorflow":
        return False
    if keras.__version__ not in VERIFIED:
        bugs = upstream_bugs()
        if not bugs:
            log.info("Keras %s fits under MultiWorkerMirroredStrategy as it is: no workaround", keras.__version__)
            return False
        raise ConfigError(
            f"strategy=multi_worker: Keras {keras.__version__} still has the multi-worker fit bug(s) {bugs} "
            f"(keras#20585), and trainer/distribute/compat.py's workaround is verified only on Keras "
            f"{', '.join(VERIFIED)}; "
            f"install one of those, or check the workaround on this version and add it to compat.VERIFIED"
        )
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original_build = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = tf_trainer.reduce_per_replica
    _originals.update(build=original_build, reduce=original_reduce)

    def local_batch(strategy, batch):
        def first(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        return tree.map_structure(first, batch)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None or not in_multi_worker_mode(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, step_iterator in iterator:  # the upstream code takes the first batch the same way
            data_batch = local_batch(strategy, next(step_iterator))
            break
        return original_build(self, iterator=None, data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not in_multi_worker_mode(strategy):
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
