"""How far the training step is from what the hardware does: the step's achieved FLOP/s against a large matmul's
in the precision the step computes in (float32, or bfloat16 for `mixed_bfloat16`), measured in the same process.

    python -m benchmarks --only step_flops

The model's FLOPs per image come from its layers (`model_flops`: convolutions and dense
layers, 2 per multiply-add; batch norm, activations and pooling are left out as small);
a training step costs three times the forward pass (the backward pass computes the
gradients of the inputs and of the weights, each about one forward). The achieved rate is
that times the images per second `fit` trains. The same row runs on a GPU. The bfloat16 peak is the physical
limit of a `mixed_bfloat16` step (its convolutions and matmuls run in bfloat16), and the row beside it says how far
bfloat16's peak is above float32's on this machine.
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


def matmul_flops_per_second(size: int, seconds: float, dtype: str = "float32") -> float:
    """The FLOP/s of repeated `size` x `size` matmuls in `dtype` (float32, bfloat16), best of three rounds."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([size, size], seed=0), dtype)
    b = tf.cast(tf.random.normal([size, size], seed=1), dtype)
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


def _training_rate(build, policy: str, image_size: int, batch: int, steps: int, epochs: int) -> float:
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, image_size, image_size, 3)).astype(np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int32)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    return fit_rate(model, dataset, steps, epochs=epochs)[0]


PEAK_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16"}  # what a policy's matmuls and convolutions use


def step_flops(folder: Path, quick: bool) -> list[Row]:
    from trainer.models.vgg19 import build_vgg19

    seconds = 1.0 if quick else 3.0

    def peaks() -> dict[str, float]:
        return {dtype: matmul_flops_per_second(MATMUL_SIZE, seconds, dtype) / 1e9 for dtype in PEAK_DTYPE.values()}

    first = peaks()
    rows = []
    cases = [
        ("the demo model (quarter-width VGG19, 32 px, batch 64)", demo_model, 32, 64, 4 if quick else 20),
        ("full-width VGG19 at 224 px (batch 8)", lambda: build_vgg19(10, (224, 224, 3), batch_norm=True), 224, 8,
         1 if quick else 3),
    ]  # fmt: skip
    for name, build, size, batch, steps in cases:
        flops = TRAINING_PASSES * model_flops(build())
        for policy in PEAK_DTYPE:
            images_per_second = _training_rate(build, policy, size, batch, steps, epochs=2 if quick else 3)
            rows.append((name, policy, flops, flops * images_per_second / 1e9))
    second = peaks()
    peak = {dtype: max(first[dtype], second[dtype]) for dtype in first}  # before and after: the better of two
    return [
        Row(
            f"Matmul peak, {MATMUL_SIZE}^2 bfloat16 vs float32 (the physical limit of each precision here)",
            peak["bfloat16"],
            peak["float32"],
            "GFLOP/s",
            None,
        ),
        *(
            Row(
                f"Training step FLOP/s, {name}, {policy}: {flops / 1e9:.3g} GFLOP per image, vs a {MATMUL_SIZE}^2 "
                f"{PEAK_DTYPE[policy]} matmul's (baseline)",
                achieved,
                peak[PEAK_DTYPE[policy]],
                "GFLOP/s",
                None,
            )
            for name, policy, flops, achieved in rows
        ),
    ]
