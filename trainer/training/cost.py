"""What a run will cost: the memory its batch, image size and model need before the first step, and its time
after the first steps.

    python run.py dataset=folder dataset.data_dir=photos/ dataset.val_fraction=0.2      # 224x224, batch 128
    python run.py dataset=folder dataset.data_dir=photos/ dataset.val_fraction=0.2 experiment=photos_quick

The memory estimate adds to what the process holds when the model is built (TensorFlow,
the data, the weights) what training adds: the activations each step keeps for the
backward pass (every layer's output, for the whole batch), the gradients and the
optimizer's slots, and the input pipeline's buffers. `RunTime` logs the time per epoch
and the whole run's after the first steps, and again after the first epoch.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import keras

from trainer.models.preprocessing import inner_layers

log = logging.getLogger(__name__)

GB = 1e9
# What a training step holds per value of every layer's output, as a multiple of the output itself: the forward
# outputs kept for the backward pass, the gradients flowing back and the kernels' scratch. Measured on the CPU
# with tests/test_run_cost.py (peak RSS of VGG19 runs at several sizes, widths and batches): 4 bytes a value in
# float32 and in mixed_bfloat16 alike (the CPU's bfloat16 kernels keep float32 copies), so the CPU counts 4.
ACTIVATION_FACTOR = 1.0
CPU_BYTES_PER_VALUE = 4
TRACING_BYTES = 300e6  # tracing the step functions and TensorFlow's per-step buffers, measured alike
WARN_SHARE = 0.8  # an estimate above this share of the memory available is warned about


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a training run needs at its peak, by what needs them."""

    process: float  # what the process holds already: TensorFlow, the data, the weights
    activations: float  # the batch's layer outputs kept for the backward pass
    state: float  # gradients, optimizer slots (EMA, accumulation), and the tracing
    pipeline: float  # the shuffle buffer and the prefetched batches

    @property
    def total(self) -> float:
        return self.process + self.activations + self.state + self.pipeline

    def describe(self) -> str:
        return (
            f"activations {gigabytes(self.activations)}, gradients and optimizer state {gigabytes(self.state)}, "
            f"input pipeline {gigabytes(self.pipeline)}, this process now {gigabytes(self.process)}"
        )


def gigabytes(size: float) -> str:
    """`1.42 GB`, `31.4 GB`."""
    return f"{size / GB:.2f} GB" if size < 10 * GB else f"{size / GB:.1f} GB"


def values_per_image(model: keras.Model) -> int:
    """How many values the outputs of every layer of `model` (nested models opened) hold for one image."""
    total = 0
    for layer in inner_layers(model):
        if isinstance(layer, keras.Model | keras.layers.InputLayer):
            continue  # a nested model's output is its last layer's; an input is the batch itself
        try:
            shapes = [tensor.shape for tensor in keras.tree.flatten(layer.output)]
        except (AttributeError, ValueError):  # a layer called twice has no single output
            continue
        total += sum(math.prod(dim or 1 for dim in shape[1:]) for shape in shapes)
    return total


def optimizer_slots(name: str, momentum: float = 0.0, ema: bool = False, accumulate: bool = False) -> int:
    """Copies of the trainable weights the optimizer keeps: Adam's two moments, SGD's velocity, the EMA, the
    accumulated gradients."""
    slots = {"sgd": 1 if momentum else 0}.get(name, 2)  # Adam, AdamW and (assumed) your own: two
    return slots + int(ema) + int(accumulate)


def estimate_memory(
    model: keras.Model,
    batch: int,
    bytes_per_value: int,
    slots: int,
    pipeline_bytes: float,
    process_bytes: float,
) -> MemoryEstimate:
    """The peak a training step of `model` on `batch` images reaches (all replicas of this machine).

    Args:
        model: The training model (augmentation and network), built.
        batch: Images per step on this machine.
        bytes_per_value: 4 for float32 compute, 2 for mixed precision.
        slots: The optimizer's copies of the weights (`optimizer_slots`).
        pipeline_bytes: The input pipeline's buffers.
        process_bytes: What the process holds now.
    """
    activations = ACTIVATION_FACTOR * values_per_image(model) * bytes_per_value * batch
    trainable = sum(math.prod(weight.shape) for weight in model.trainable_weights)
    state = 4 * trainable * (1 + slots) + TRACING_BYTES  # gradients and slots in float32
    return MemoryEstimate(process_bytes, activations, state, pipeline_bytes)


def fitting_batch(estimate: MemoryEstimate, batch: int, available: float, multiple: int = 1) -> int:
    """The largest power of two (a multiple of `multiple`, the replicas) whose estimate stays within
    `WARN_SHARE` of `available`; 0 when not even `multiple` images fit."""
    per_image = (estimate.activations + estimate.pipeline) / batch
    room = WARN_SHARE * available - estimate.process - estimate.state
    most = int(room // per_image) if per_image else batch
    fitting = 2 ** int(math.log2(most)) if most >= 1 else 0
    return fitting - fitting % multiple if fitting >= multiple else 0


def process_rss() -> float:
    """This process's resident memory in bytes (/proc/self/statm; 0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return float(pages * os.sysconf("SC_PAGE_SIZE"))


def available_ram() -> float | None:
    """The memory this process may still take: /proc/meminfo's MemAvailable, less if a cgroup limit (a
    container's) leaves less; None where neither can be read (not Linux)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return float(min(found)) if found else None


def gpu_memory() -> tuple[float, float] | None:
    """(total, in use by this process's TensorFlow) bytes of the first GPU, None without one: the total from
    nvidia-smi (TensorFlow tells only its own use)."""
    import subprocess

    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    try:
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        total = float(answer.stdout.split()[0]) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return total, float(tf.config.experimental.get_memory_info("GPU:0")["current"])


def duration(seconds: float) -> str:
    """`41 s`, `41 min`, `20 h`, `3.5 days`: as rounded as an estimate deserves."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h" if seconds < 10 * 3600 else f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.1f} days"


class RunTime(keras.callbacks.Callback):
    """Logs what the run will take: once its first steps are timed (the first step, which traces, left out),
    the time per epoch and for the epochs left; after its first epoch, the same from that epoch's time
    (validation and saving included; the first training and validation steps' tracing counted as ordinary
    steps). Once per `fit`."""

    def __init__(self, steps_per_epoch: int, epochs: int, first_epoch: int = 0, clock=time.perf_counter):
        super().__init__()
        self.steps, self.epochs, self.first_epoch, self.clock = steps_per_epoch, epochs, first_epoch, clock
        self.mark: tuple[float, int] | None = None  # (time, step) at the end of the first step
        self.said_steps = self.said_epoch = False
        self.epoch_started = self.per_step = 0.0
        self.validation: list[float] = []  # the first epoch's validation: its start, then each batch's end

    def _left(self, epoch: int) -> str:
        left = self.epochs - epoch
        which = f"{left} epochs" if epoch == 0 else f"the {left} epochs left of {self.epochs}"
        return f"{which} (trainer.epochs)"

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_started = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        if self.said_steps:
            return
        now = self.clock()
        if self.mark is None:
            self.mark = (now, batch)
            return
        seconds, steps = now - self.mark[0], batch - self.mark[1]
        if steps >= 20 or (steps >= 3 and seconds >= 2.0) or (steps and batch + 1 >= self.steps):  # or the last
            self.said_steps, self.per_step = True, seconds / steps
            epoch = seconds / steps * self.steps
            log.info(
                "~%s per epoch (%.3g s per step x %d steps), ~%s for %s; validation comes on top",
                duration(epoch), seconds / steps, self.steps, duration(epoch * (self.epochs - self.first_epoch)),
                self._left(self.first_epoch),
            )  # fmt: skip

    def on_test_begin(self, logs=None):
        if not self.said_epoch:
            self.validation = [self.clock()]

    def on_test_batch_end(self, batch, logs=None):
        if not self.said_epoch and self.validation:
            self.validation.append(self.clock())

    def _tracing(self) -> float:
        """Seconds the first epoch spent tracing: its first training and validation steps, less what an
        ordinary step of each takes."""
        traced = 0.0
        if self.mark is not None and self.said_steps:
            traced += max(0.0, self.mark[0] - self.epoch_started - self.per_step)
        times = self.validation
        if len(times) >= 3:  # a first batch, and others to compare it with
            ordinary = (times[-1] - times[1]) / (len(times) - 2)
            traced += max(0.0, times[1] - times[0] - ordinary)
        return traced

    def on_epoch_end(self, epoch, logs=None):
        if self.said_epoch:
            return
        self.said_epoch = True
        seconds = self.clock() - self.epoch_started - self._tracing()
        left = self.epochs - epoch - 1
        if left:
            log.info(
                "After epoch %d: ~%s per epoch (validation included, tracing left out), ~%s for %s",
                epoch + 1, duration(seconds), duration(seconds * left), self._left(epoch + 1),
            )  # fmt: skip
