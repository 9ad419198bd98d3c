"""Compiling a model for one phase: the configured optimizer and schedule, the loss, the metrics.

    python run.py optimizer=sgd optimizer.schedule.name=cosine trainer.grad_accum_steps=4
    python run.py trainer.precision=mixed_float16    # the optimizer wrapped in a LossScaleOptimizer

`trainer.tasks.phases` calls `compile_model` inside the strategy's scope before each phase's `fit`, and again
before the test evaluation a resumed run missed.
"""

from __future__ import annotations

import keras

from trainer.config.schema import Config
from trainer.distribute.accumulation import accumulate_across_replicas
from trainer.runs.checkpoints import mixed_policy
from trainer.training.losses import build_loss
from trainer.training.metrics import training_metrics
from trainer.training.optimizers import build_learning_rate, build_optimizer


def compile_model(model: keras.Model, settings: Config, lr: float, steps_per_epoch: int, epochs: int) -> None:
    """Compiles with the configured optimizer and schedule at peak rate `lr`; call inside the scope."""
    opt = settings.optimizer
    schedule = opt.schedule
    learning_rate = build_learning_rate(
        schedule.name,
        lr,
        steps_per_epoch,
        epochs,
        warmup_epochs=schedule.warmup_epochs,
        alpha=schedule.alpha,
        boundaries=list(schedule.boundaries),
        factor=schedule.factor,
    )
    options = opt.keras_options()
    if settings.trainer.grad_accum_steps > 1:
        options["gradient_accumulation_steps"] = settings.trainer.grad_accum_steps
    optimizer = accumulate_across_replicas(build_optimizer(opt._target_, learning_rate, options))
    if mixed_policy(model) == "mixed_float16":  # as trainer.precision (auto too) built it
        # Wrapped here rather than by compile, so the checkpoint's compile config names the loss-scale
        # optimizer: load_model rebuilds it under any global policy and loads its saved variables (wrapped
        # by compile, a float32 process rebuilt a bare Adam: "Skipping variable loading ... (117 vs 121)").
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    soft = settings.dataset.augment.mixing  # MixUp's and CutMix's labels
    model.compile(
        optimizer=optimizer,
        loss=build_loss(settings.trainer.label_smoothing, soft),
        metrics=training_metrics(soft),  # with the data loss: Keras's loss adds the L2 penalty
        jit_compile={"auto": "auto", "true": True, "false": False}[settings.trainer.jit_compile],
        steps_per_execution=settings.trainer.steps_per_execution,
    )
