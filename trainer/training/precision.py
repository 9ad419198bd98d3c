"""Which precision a run trains in: `trainer.precision=auto` picks one for the hardware and the model.

    python run.py                                    # auto: float32 for the digits demo on any machine
    python run.py model.width_multiplier=1 dataset.image_size=224 ...   # auto: mixed_bfloat16 on an AMX CPU
    python run.py trainer.precision=mixed_bfloat16   # forced

- `mixed_bfloat16` where the hardware runs bfloat16 natively: a CPU with AMX-BF16 or AVX512-BF16
  (`/proc/cpuinfo`), an NVIDIA GPU of compute capability 8.0 or more;
- `mixed_float16` on NVIDIA GPUs of compute capability 7.x (tensor cores without bfloat16);
- `float32` everywhere else, and for a model too small to gain: below `MIN_GFLOPS_PER_IMAGE` forward GFLOPs
  per image. Measured on the digits demo's network (VGG19 at width 0.25, 32 px: 0.05 GFLOPs): on a CPU with
  AMX-BF16 it trained 4 epochs in 17 s in bfloat16 against float32's 15 s (issue 52); on one with AVX512-BF16
  its step runs 1.2x float32's (`python -m benchmarks --only precision`, alone), but trained in bfloat16 the
  demo falls below its 99% floor of test accuracy on seeds 6 and 7, which float32 holds on every seed of 0-19
  (`--only precision_demo`): a model this small gains little speed and loses accuracy. Full-width VGG19 from
  32 px up (0.8 GFLOPs) gains 1.7x at 224 px with AVX512-BF16 (3.8x with AMX-BF16).

Mixed policies keep variables, the softmax, the loss and batch norm's statistics in float32; what a run saves is
float32 (`trainer.runs.checkpoints.save`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

log = logging.getLogger(__name__)

CHOICES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
MIN_GFLOPS_PER_IMAGE = 0.1  # forward GFLOPs per image below which auto keeps float32 (see the module docstring)
CPU_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))  # /proc/cpuinfo flag, its name


@dataclass(frozen=True)
class Hardware:
    """What the run's devices compute natively: the CPU's bfloat16 instructions ("" none) and the NVIDIA GPUs'
    compute capability (None: no GPU)."""

    cpu_bfloat16: str = ""
    gpu_capability: tuple[int, int] | None = None

    def native(self) -> tuple[str, str]:
        """(the mixed policy these devices run natively, or float32; the reason, for the log)."""
        if self.gpu_capability is not None:
            major, minor = self.gpu_capability
            if major >= 8:
                return "mixed_bfloat16", f"GPU of compute capability {major}.{minor}"
            if major == 7:
                return "mixed_float16", f"GPU of compute capability {major}.{minor}: float16 tensor cores"
            return "float32", f"GPU of compute capability {major}.{minor}: no half-precision tensor cores"
        if self.cpu_bfloat16:
            return "mixed_bfloat16", f"CPU has {self.cpu_bfloat16}"
        return "float32", "no native bfloat16 on this CPU"


def cpu_bfloat16(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The name of the CPU's native bfloat16 instructions (`AMX-BF16`, `AVX512-BF16`), "" without (or no
    /proc/cpuinfo)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return ""
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return next((name for flag, name in CPU_FLAGS if flag in flags), "")


def detect_hardware() -> Hardware:
    """The hardware of this process: its first GPU's compute capability, else the CPU's instructions."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")
        if capability:
            return Hardware(gpu_capability=tuple(capability))
    return Hardware(cpu_bfloat16=cpu_bfloat16())


def gflops_per_image(model: keras.Model) -> float:
    """Forward GFLOPs (2 per multiply-add) of one image through `model`'s convolutions and dense layers, nested
    models included; other layers cost little beside them."""
    total = 0.0
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            total += gflops_per_image(layer) * 1e9
            continue
        kernel = getattr(layer, "kernel", None)
        output = getattr(layer, "output", None)
        if kernel is None or output is None or not isinstance(layer, keras.layers.Conv2D | keras.layers.Dense):
            continue
        positions = int(np.prod([dim for dim in output.shape[1:-1] if dim])) if len(output.shape) > 2 else 1
        total += 2.0 * positions * int(np.prod(kernel.shape))
    return total / 1e9


def choose(requested: str, hardware: Hardware, gflops: float | None = None) -> tuple[str, str]:
    """(the policy to train in, why), for `requested` (one of `CHOICES`) on `hardware`; `gflops`: the model's
    `gflops_per_image` (None: not known yet; auto then names the policy to build in before it is counted)."""
    if requested != "auto":
        if requested == "mixed_float16" and hardware.gpu_capability is None:
            return requested, "emulated on the CPU, slow: float16 is for GPUs of compute capability 7.0 or more"
        if requested == "mixed_bfloat16" and not hardware.gpu_capability and not hardware.cpu_bfloat16:
            return requested, "emulated on this CPU, slower than float32: it has no AMX-BF16 or AVX512-BF16"
        return requested, "as set"
    policy, reason = hardware.native()
    if policy != "float32" and gflops is not None and gflops < MIN_GFLOPS_PER_IMAGE:
        return "float32", (
            f"{reason}, but the model's {gflops:.3g} GFLOPs per image are below the {MIN_GFLOPS_PER_IMAGE:g} at "
            f"which half precision pays"
        )
    return policy, reason
