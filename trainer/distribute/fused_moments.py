"""Workaround: synchronized batch norm all-reduces its three moments in one collective, not three.

    TF_CONFIG=... python run.py strategy=multi_worker      # VGG19 with batch norm: 16 collectives a step, not 48

Every collective a multi-worker process launches keeps about 1.5 KB that is never freed (TensorFlow 2.21;
tensorflow#42616, open since TF 2.3; reproduced without Keras: 20 all-reduces a call, 1,000 calls, +30 MB,
whatever the tensors' size or the collective timeout). Keras 3's synchronized batch norm
(`keras/src/backend/tensorflow/nn.py::_compute_moments_sync`) launches three all-reduces per layer and step
(the sum, the squared sum, the count), so VGG19's 16 batch-norm layers made 48 of a step's ~53 collectives and
most of that growth. Here the three go as one list, which the strategy packs into one all-reduce (as it packs
the gradients): the same sums, a third of the collectives.

`apply()` is called when `strategy=multi_worker` is built, and patches only the Keras versions in `VERIFIED`;
on any other, nothing is patched (the growth is three times as fast, nothing is wrong). Ledger: docs/development.md,
row 17; canary: tests/test_upstream_canaries.py.
"""

from __future__ import annotations

import keras

VERIFIED = ("3.15.1",)  # Keras versions whose `_compute_moments_sync` this replaces (read and compared)
_applied = False


def _compute_moments_sync(x, axes, keepdims):
    """Keras's synchronized moments, with the three all-reduces made one."""
    import tensorflow as tf

    replica_ctx = tf.distribute.get_replica_context()
    if not replica_ctx:
        from keras.src.backend.tensorflow.nn import _compute_moments

        return _compute_moments(x, axes, keepdims)
    local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
    local_squared_sum = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
    local_count = tf.reduce_sum(tf.ones_like(x, name="count"), axis=axes, keepdims=True)
    y_sum, y_squared_sum, count_sum = replica_ctx.all_reduce(
        tf.distribute.ReduceOp.SUM, [local_sum, local_squared_sum, local_count]
    )
    mean = tf.math.divide_no_nan(y_sum, count_sum)
    y_squared_mean = tf.math.divide_no_nan(y_squared_sum, count_sum)
    variance = tf.maximum(y_squared_mean - tf.square(mean), 0.0)  # var = E(x^2) - E(x)^2
    if not keepdims:
        mean = tf.squeeze(mean, axes)
        variance = tf.squeeze(variance, axes)
    return mean, variance


def apply() -> bool:
    """Installs the fused moments on a verified Keras; whether they are installed."""
    global _applied
    if keras.__version__ not in VERIFIED:
        return False
    if not _applied:
        from keras.src.backend.tensorflow import nn

        nn._compute_moments_sync = _compute_moments_sync
        _applied = True
    return True
