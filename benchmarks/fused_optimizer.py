"""The fused-optimizer experiment (issue 52 part 5): Adam and SGD whose update is one TensorFlow fused apply op
per variable, as Keras 2 built it (`tf.raw_ops.ResourceApplyAdam`, `ResourceApplyKerasMomentum`,
`ResourceApplyGradientDescent`), against Keras's own: the first training step of `debug=smoke`'s network, and
the weights after 10 steps. The trainer would make them its Adam and SGD only if the first step were faster AND
the weights equal Keras's within 1e-6; the rows say whether.

    python -m benchmarks --only fused_optimizer

Keras 3 writes each variable's update as a handful of element-wise ops (Adam: about ten per variable), which
Keras traces in Python and TensorFlow then optimizes before the first step runs. The fused kernels compute the
same formulas (Adam's epsilon outside the square root, Keras's momentum sign) in one op. Everything around the
update (the loss scale, gradient accumulation, the EMA, weight decay, clipping) stays Keras's: only
`update_step` is replaced, and a sparse gradient or AMSGrad falls back to Keras's own.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import Row

WEIGHTS_TOLERANCE = 1e-6  # the largest difference from Keras's weights after 10 steps that would allow the swap


def fused_classes() -> tuple[type, type]:
    """(FusedAdam, FusedSGD): Keras's Adam and SGD with `update_step` replaced (made on first use: this module is
    imported with the benchmark list, before TensorFlow)."""
    import keras
    import tensorflow as tf

    def _dense(gradient) -> bool:
        return not isinstance(gradient, tf.IndexedSlices)

    class FusedAdam(keras.optimizers.Adam):
        """`keras.optimizers.Adam` updating each variable with one `ResourceApplyAdam`."""

        def _backend_update_step(self, grads, trainable_variables, learning_rate):
            step = tf.cast(self.iterations + 1, tf.float32)  # once a step, not once a variable
            self._powers = (
                tf.pow(tf.cast(self.beta_1, tf.float32), step),
                tf.pow(tf.cast(self.beta_2, tf.float32), step),
            )
            super()._backend_update_step(grads, trainable_variables, learning_rate)

        def update_step(self, gradient, variable, learning_rate):
            if self.amsgrad or not _dense(gradient):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            index = self._get_variable_index(variable)
            beta_1_power, beta_2_power = (tf.cast(power, dtype) for power in self._powers)
            tf.raw_ops.ResourceApplyAdam(
                var=variable.handle,
                m=self._momentums[index].value.handle,
                v=self._velocities[index].value.handle,
                beta1_power=beta_1_power,
                beta2_power=beta_2_power,
                lr=tf.cast(learning_rate, dtype),
                beta1=tf.cast(self.beta_1, dtype),
                beta2=tf.cast(self.beta_2, dtype),
                epsilon=tf.cast(self.epsilon, dtype),
                grad=tf.cast(gradient, dtype),
            )

    class FusedSGD(keras.optimizers.SGD):
        """`keras.optimizers.SGD` updating each variable with one `ResourceApplyKerasMomentum` (with momentum) or
        `ResourceApplyGradientDescent` (without)."""

        def update_step(self, gradient, variable, learning_rate):
            if not _dense(gradient):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            learning_rate, gradient = tf.cast(learning_rate, dtype), tf.cast(gradient, dtype)
            if self.momentum == 0:
                tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=learning_rate, delta=gradient)
                return
            tf.raw_ops.ResourceApplyKerasMomentum(
                var=variable.handle,
                accum=self.momentums[self._get_variable_index(variable)].value.handle,
                lr=learning_rate,
                grad=gradient,
                momentum=tf.cast(self.momentum, dtype),
                use_nesterov=self.nesterov,
            )

    return FusedAdam, FusedSGD


OPTIMIZERS = {  # name: (keyword arguments, Keras's class name, the index of the fused class in fused_classes())
    "Adam": ({"learning_rate": 1e-3}, "Adam", 0),
    "SGD (momentum 0.9)": ({"learning_rate": 0.01, "momentum": 0.9}, "SGD", 1),
}


def _smoke_network():
    from trainer.models.vgg19 import build_vgg19

    return build_vgg19(10, (32, 32, 3), width_multiplier=0.125, fc_units=64, dropout=0.0)  # debug=smoke's


def _dense_network():
    import keras

    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])


def _train(build, make_optimizer, steps: int) -> tuple[float, list[np.ndarray]]:
    """(seconds of the first step: tracing, graph optimization and the step, the weights after `steps` steps)."""
    import keras

    rng = np.random.default_rng(0)
    images, labels = rng.random((16, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 16)
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)  # as run.py does before fit
    started = time.perf_counter()
    model.train_on_batch(images, labels)
    first = time.perf_counter() - started
    for _ in range(steps - 1):
        model.train_on_batch(images, labels)
    return first, [variable.numpy() for variable in model.trainable_variables]


def _difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def fused_optimizer(folder: Path, quick: bool) -> list[Row]:
    """Per optimizer: the first step (best of alternating rounds, each on a new model) fused vs Keras's, and the
    largest weight difference after 10 steps on the network and on one dense layer (the formulas alone)."""
    import keras

    rows, classes = [], fused_classes()
    for name, (options, keras_name, index) in OPTIMIZERS.items():

        def plain(options=options, keras_name=keras_name):
            return getattr(keras.optimizers, keras_name)(**options)

        def fused(options=options, index=index):
            return classes[index](**options)

        firsts = {"keras": [], "fused": []}
        weights = {}
        for _ in range(1 if quick else 3):
            for kind, make in (("keras", plain), ("fused", fused)):
                first, weights[kind] = _train(_smoke_network, make, 10)
                firsts[kind].append(first)
        dense = _difference(_train(_dense_network, plain, 10)[1], _train(_dense_network, fused, 10)[1])
        difference = _difference(weights["keras"], weights["fused"])
        rows += [
            Row(
                f"Fused {name} (one apply op per variable): first step of debug=smoke's network vs Keras's {name}",
                min(firsts["fused"]),
                min(firsts["keras"]),
                "s",
                None,
                higher_is_better=False,
            ),
            Row(
                f"Fused {name}: largest weight difference from Keras's after 10 steps, that network (one dense "
                f"layer: {dense:.1e}), in units of the {WEIGHTS_TOLERANCE:g} that would make it the default",
                difference / WEIGHTS_TOLERANCE,
                1.0,
                "x 1e-6",
                None,
                higher_is_better=False,
            ),
        ]
    return rows
