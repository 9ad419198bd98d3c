"""Compiling a model for one phase: its optimizer (wrapped for accumulation and loss scaling), the loss, the metrics.

    python run.py optimizer=sgd optimizer.schedule.name=cosine trainer.grad_accum_steps=4
    python run.py trainer.precision=mixed_float16    # the optimizer wrapped in a LossScaleOptimizer

`trainer.tasks.phases.compile_phase` reads the config and calls these inside the strategy's scope before each
phase's `fit`, and again before the test evaluation a resumed run missed.
"""

from __future__ import annotations

from typing import Any

import keras

from trainer.distribute.accumulation import accumulate_across_replicas
from trainer.runs.checkpoints import mixed_policy
from trainer.training.losses import build_loss
from trainer.training.metrics import training_metrics
from trainer.training.optimizers import build_optimizer

JIT_COMPILE = {"auto": "auto", "true": True, "false": False}  # trainer.jit_compile -> Keras's compile(jit_compile=)


def build_phase_optimizer(
    target: str, options: dict[str, Any], learning_rate: Any, grad_accum_steps: int = 1
) -> keras.optimizers.Optimizer:
    """The Keras optimizer `target` at `learning_rate` (a float or a schedule) with its `options`, averaging the
    gradients of `grad_accum_steps` batches per update (1: every batch), under a strategy too."""
    if grad_accum_steps > 1:
        options = {**options, "gradient_accumulation_steps": grad_accum_steps}
    return accumulate_across_replicas(build_optimizer(target, learning_rate, options))


def compile_model(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    label_smoothing: float = 0.0,
    soft_labels: bool = False,
    jit_compile: str = "auto",
    steps_per_execution: int = 1,
) -> None:
    """Compiles `model` with `optimizer`; call inside the strategy's scope.

    Args:
        model: The training model.
        optimizer: From `build_phase_optimizer`; wrapped in a `LossScaleOptimizer` when the model is float16.
        label_smoothing: Targets become (1 - s) one-hot + s / classes.
        soft_labels: The labels are class probabilities (MixUp, CutMix), not indices.
        jit_compile: auto, true or false (XLA).
        steps_per_execution: Training steps run per call into TensorFlow.
    """
    if mixed_policy(model) == "mixed_float16":  # as trainer.precision (auto too) built it
        # Wrapped here rather than by compile, so the checkpoint's compile config names the loss-scale
        # optimizer: load_model rebuilds it under any global policy and loads its saved variables (wrapped
        # by compile, a float32 process rebuilt a bare Adam: "Skipping variable loading ... (117 vs 121)").
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=build_loss(label_smoothing, soft_labels),
        metrics=training_metrics(soft_labels),  # with the data loss: Keras's loss adds the L2 penalty
        jit_compile=JIT_COMPILE[str(jit_compile)],
        steps_per_execution=steps_per_execution,
    )
