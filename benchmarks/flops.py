"""How far the training step is from what the hardware does: the step's achieved FLOP/s against a large float32
matmul's, measured in the same process.

    python -m benchmarks --only step_flops

The model's FLOPs per image come from its layers (`model_flops`: convolutions and dense
layers, 2 per multiply-add; batch norm, activations and pooling are left out as small);
a training step costs three times the forward pass (the backward pass computes the
gradients of the inputs and of the weights, each about one forward). The achieved rate is
that times the images per second `fit` trains. The same row runs on a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import Row, demo_model, fit_rate

MATMUL_SIZE = 4096  # large enough to reach the machine's float32 peak on a CPU (2048 fell short); a GPU wants 8192
TRAINING_PASSES = 3  # forward + the two halves of the backward pass


def model_flops(model) -> int:
    """FLOPs of one image's forward pass through the convolutions and dense layers of `model` (nested too)."""
    import keras

    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            total += model_flops(layer)
        elif isinstance(layer, keras.layers.Conv2D):
            height, width, channels = layer.output.shape[1:]
            kernel_height, kernel_width, inputs_per_group, _ = layer.kernel.shape
            total += 2 * height * width * channels * kernel_height * kernel_width * inputs_per_group
        elif isinstance(layer, keras.layers.Dense):
            inputs, units = layer.kernel.shape
            total += 2 * inputs * units
    return int(total)


def matmul_flops_per_second(size: int, seconds: float) -> float:
    """The float32 FLOP/s of repeated `size` x `size` matmuls, best of three rounds."""
    import tensorflow as tf

    a = tf.random.normal([size, size], seed=0)
    b = tf.random.normal([size, size], seed=1)
    step = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)))
    step(a, b).numpy()  # traced and warm
    best = 0.0
    for _ in range(3):
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            step(a, b).numpy()
            count += 1
        best = max(best, 2 * size**3 * count / elapsed)
    return best


def _training_rate(model, image_size: int, batch: int, steps: int, epochs: int) -> float:
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, image_size, image_size, 3)).astype(np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int32)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    model.compile(keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return fit_rate(model, dataset, steps, epochs=epochs)[0]


def step_flops(folder: Path, quick: bool) -> list[Row]:
    import keras

    from trainer.models.vgg19 import build_vgg19

    seconds = 1.0 if quick else 3.0
    peak = matmul_flops_per_second(MATMUL_SIZE, seconds) / 1e9
    rows = []
    cases = [
        ("the demo model (quarter-width VGG19, 32 px, batch 64)", demo_model, 32, 64, 4 if quick else 20),
        ("full-width VGG19 at 224 px (batch 8)", lambda: build_vgg19(10, (224, 224, 3), batch_norm=True), 224, 8,
         1 if quick else 3),
    ]  # fmt: skip
    for name, build, size, batch, steps in cases:
        keras.utils.set_random_seed(0)
        model = build()
        flops = TRAINING_PASSES * model_flops(model)
        images_per_second = _training_rate(model, size, batch, steps, epochs=2 if quick else 3)
        achieved = flops * images_per_second / 1e9
        rows.append((name, flops, achieved))
    peak = max(peak, matmul_flops_per_second(MATMUL_SIZE, seconds) / 1e9)  # before and after: the better of two
    return [
        Row(
            f"Training step FLOP/s, {name}: {flops / 1e9:.3g} GFLOP per image, vs a {MATMUL_SIZE}^2 float32 "
            f"matmul's (baseline)",
            achieved,
            peak,
            "GFLOP/s",
            None,
        )
        for name, flops, achieved in rows
    ]
