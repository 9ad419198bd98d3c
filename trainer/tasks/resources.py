"""The memory a training run needs, checked before its first step against what the machine has.

    python run.py dataset=folder dataset.data_dir=photos/ dataset.val_fraction=0.2    # refused on a small CPU box
    python run.py ... trainer.check_memory=false                                     # try anyway

Above the memory available: one line with the estimate, what is available and the settings
that fit, and the run stops before anything is trained. Near it: a warning. Otherwise one
info line. The estimate (`trainer.training.cost`) is within 30% of the peak RSS measured
on the CPU (tests/test_run_cost.py).
"""

from __future__ import annotations

import logging

from trainer.config.schema import Config
from trainer.errors import ConfigError
from trainer.models.preprocessing import Models
from trainer.tasks.plan import Plan
from trainer.training import cost

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 4  # batches the input pipeline holds ready (prefetch, the host's augmentation)
QUICK = {"image_size": 96, "width": 0.25, "batch": 32}  # experiment=photos_quick


def _pipeline_bytes(settings: Config, plan: Plan) -> float:
    """The shuffle buffer's images, the prefetched batches and the in-memory cache the first epoch fills."""
    data, batch = plan.data, settings.trainer.batch_size
    stored = data.resize_to**2 * 3  # uint8
    shuffled = min(settings.dataset.shuffle_buffer, data.num_examples["train"]) * stored
    prefetched = PREFETCH_BATCHES * batch * stored * (4 if data.augment.mixing else 1)  # MixUp/CutMix: float32
    in_memory = [split for split, entry in data.cache_entries.items() if entry.get("mode") == "memory"]
    cached = sum(data.num_examples.get(split, 0) * stored for split in in_memory)
    return float(shuffled + prefetched + cached)


def _slots(settings: Config) -> int:
    optimizer = settings.optimizer
    return cost.optimizer_slots(
        optimizer.name,
        float(getattr(optimizer, "momentum", 0.0) or 0.0),
        optimizer.ema_momentum is not None,
        settings.trainer.grad_accum_steps > 1,
    )


def _quick_fits(settings: Config, estimate: cost.MemoryEstimate, available: float) -> bool:
    """Whether experiment=photos_quick's size (96x96, width 0.25, batch 32) fits, scaled from this estimate:
    activations grow with pixels and width, weights with width squared."""
    width = getattr(settings.model, "width_multiplier", None)
    size, batch = settings.dataset.input_size, settings.trainer.batch_size
    if width is None or (size, width) == (QUICK["image_size"], QUICK["width"]):
        return False
    scale = (QUICK["image_size"] / size) ** 2 * (QUICK["width"] / width)
    activations = estimate.activations * scale * QUICK["batch"] / batch
    state = (estimate.state - cost.TRACING_BYTES) * (QUICK["width"] / width) ** 2 + cost.TRACING_BYTES
    need = estimate.process + state + activations + estimate.pipeline * QUICK["batch"] / batch
    return need <= cost.WARN_SHARE * available


def _fits(settings: Config, estimate: cost.MemoryEstimate, available: float, replicas: int) -> str:
    """The settings that would fit, for the refusal's line."""
    batch = cost.fitting_batch(estimate, settings.trainer.batch_size, available, replicas)
    choices = [f"trainer.batch_size={batch}"] if batch else []
    if _quick_fits(settings, estimate, available):
        choices.append(
            f"dataset.image_size={QUICK['image_size']} model.width_multiplier={QUICK['width']} "
            f"trainer.batch_size={QUICK['batch']} (experiment=photos_quick)"
        )
    if not choices:
        return "a smaller dataset.image_size or model.width_multiplier"
    return ", or ".join(choices)


def check_memory(settings: Config, plan: Plan, models: Models, policy: str) -> cost.MemoryEstimate | None:
    """Estimates the run's peak memory and checks it against the machine's RAM (on a CPU) or the first GPU's
    memory; logs it. Returns the estimate, or None where the memory available cannot be read.

    Raises:
        ConfigError: the estimate is above what is available (unless `trainer.check_memory=false`), with the
            settings that would fit.
    """
    batch = settings.trainer.batch_size
    gpu = cost.gpu_memory()
    if gpu is not None:  # the device holds the model, its state and activations; the host the pipeline
        total, used = gpu
        values = 2 if policy.startswith("mixed") else 4  # not measured on a GPU: the values' own size
        estimate = cost.estimate_memory(models.training, batch, values, _slots(settings), 0.0, used)
        available, where = total, "on the GPU"
    else:
        pipeline, values = _pipeline_bytes(settings, plan), cost.CPU_BYTES_PER_VALUE  # whatever the policy
        estimate = cost.estimate_memory(models.training, batch, values, _slots(settings), pipeline, cost.process_rss())
        free = cost.available_ram()
        if free is None:
            return None
        available, where = free + estimate.process, "of RAM (MemAvailable and this process)"
    size = settings.dataset.input_size
    what = f"batch {batch} at {size}x{size}, {models.inference.name} of {models.inference.count_params():,} parameters"
    need, have = cost.gigabytes(estimate.total), cost.gigabytes(available)
    if estimate.total > available and settings.trainer.check_memory:
        fits = _fits(settings, estimate, available, plan.strategy.num_replicas_in_sync)
        raise ConfigError(
            f"this run needs ~{need} of memory ({what}: {estimate.describe()}) but {have} is available {where}; "
            f"settings that fit: {fits} (trainer.check_memory=false tries anyway)"
        )
    if estimate.total > cost.WARN_SHARE * available:
        log.warning(
            "This run needs ~%s of the %s available %s (%s): close to the limit; %s fits with room",
            need, have, where, what, _fits(settings, estimate, available, plan.strategy.num_replicas_in_sync),
        )  # fmt: skip
    else:
        log.info("Memory: ~%s needed (%s: %s), %s available %s", need, what, estimate.describe(), have, where)
    return estimate
