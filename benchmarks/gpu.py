"""The GPU check, one script for a machine with a GPU: `bash benchmarks/gpu_check.sh` (`--cpu-smoke` on a CPU).

    bash benchmarks/gpu_check.sh               # on one GPU: about 6 minutes
    bash benchmarks/gpu_check.sh --cpu-smoke   # the same code paths at toy sizes, on the CPU: about a minute

Prints one table:
- VGG19 training images/s at 224x224, float32 and mixed_bfloat16, each without and with XLA: the run.py path
  (uint8 in, the model's flip and standardization, the data-loss metric) against the same network in plain
  Keras fed float32;
- the input-bound ratio: the Cats-vs-Dogs 224 pipeline's images/s against the fastest training step's, and the
  CIFAR pipeline's against VGG19's at 32x32 (above 1: the pipeline keeps up);
- `trainer.precision=auto` against `float32`: the 224 training step (auto picks for the GPU and the model) and the
  digits demo's seconds of training (`python run.py`; auto must not make it slower);
- the inference latency of each export format (`python -m benchmarks --only serving`).
On the CPU, XLA rows are skipped: XLA makes VGG19 training 3-7x slower there.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import Row, fit_rate, pet_records, rate


@dataclass(frozen=True)
class Sizes:
    image: int  # training side (the Cats-vs-Dogs rows)
    batch: int
    width: float  # VGG19's width multiplier
    steps: int  # training steps per timed epoch
    records: int  # of the synthetic 224 TFRecords
    seconds: float  # each pipeline rate


FULL = Sizes(image=224, batch=64, width=1.0, steps=30, records=2048, seconds=10.0)
SMOKE = Sizes(image=32, batch=8, width=0.125, steps=3, records=64, seconds=0.5)


def _vgg19(sizes: Sizes, image: int, precision: str):
    import keras

    from trainer.models.vgg19 import build_vgg19

    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    return build_vgg19(2, (image, image, 3), width_multiplier=sizes.width, fc_units=512 if sizes.width == 1 else 64)


def _training_rate(sizes: Sizes, image: int, batch: int, precision: str, xla: bool, ours: bool) -> float:
    """Images/s of one training configuration: the run.py path (`ours`) or plain Keras, on cached batches."""
    import keras
    import tensorflow as tf

    from trainer.data.augmentation import Augmentation
    from trainer.models.preprocessing import build_models
    from trainer.training.metrics import cross_entropy

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (batch * 2, image, image, 3), dtype=np.uint8)
    labels = rng.integers(0, 2, batch * 2).astype(np.int32)
    network = _vgg19(sizes, image, precision)
    if ours:
        model = build_models(network, "standardize", Augmentation(flip=True)).training
        images, metrics = pixels, ["accuracy", cross_entropy()]
    else:
        model = network
        images, metrics = tf.image.per_image_standardization(pixels.astype(np.float32)).numpy(), ["accuracy"]
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch).repeat().cache()
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    model.compile(optimizer, loss="sparse_categorical_crossentropy", metrics=metrics, jit_compile=xla)
    try:
        return fit_rate(model, dataset, sizes.steps, epochs=3)[0]
    finally:
        keras.mixed_precision.set_global_policy("float32")


def training_rows(sizes: Sizes, gpu: bool) -> tuple[list[Row], float]:
    """The training rows, and the fastest training rate of ours (what the input pipeline must feed)."""
    rows, fastest = [], 0.0
    for precision in ("float32", "mixed_bfloat16"):
        for xla in (False, True):
            label = f"VGG19 training {sizes.image}x{sizes.image}, {precision}, XLA {'on' if xla else 'off'}"
            if xla and not gpu:
                print(f"# {label}: skipped (XLA on the CPU makes VGG19 3-7x slower)", file=sys.stderr)
                continue
            plain = _training_rate(sizes, sizes.image, sizes.batch, precision, xla, ours=False)
            mine = _training_rate(sizes, sizes.image, sizes.batch, precision, xla, ours=True)
            fastest = max(fastest, mine)
            rows.append(Row(f"{label} (run.py path vs plain Keras)", mine, plain, "img/s", 0.97))
    return rows, fastest


def input_rows(sizes: Sizes, folder: Path, fastest: float) -> list[Row]:
    from benchmarks.pipelines import _our_pets, our_cifar

    files = pet_records(folder, "raw", sizes.records)
    pets = rate(_our_pets(files, "raw", sizes.records, sizes.batch), sizes.seconds)
    _, _, cifar = our_cifar(folder, quick=sizes is SMOKE)
    cifar_rate = rate(cifar, sizes.seconds)
    cifar_step = _training_rate(sizes, 32, 128, "float32", False, ours=True)
    return [
        Row(
            "Input-bound ratio: Cats-vs-Dogs 224 raw pipeline vs the fastest training step", pets, fastest, "img/s", 1.0
        ),
        Row(
            "Input-bound ratio: CIFAR pipeline vs VGG19 training at 32x32, batch 128",
            cifar_rate,
            cifar_step,
            "img/s",
            1.0,
        ),
    ]


def precision_rows(sizes: Sizes, folder: Path) -> list[Row]:
    """`trainer.precision=auto` beside `float32`: the run.py path's 224 step in the policy auto picks for this
    device and VGG19, and the digits demo's seconds of training (one seed; --cpu-smoke: one epoch)."""
    from benchmarks.precision import _demo_run
    from trainer.training.precision import choose, detect_hardware, gflops_per_image

    network = _vgg19(sizes, sizes.image, "float32")
    auto, reason = choose("auto", detect_hardware(), gflops_per_image(network))
    step = {
        policy: _training_rate(sizes, sizes.image, sizes.batch, policy, False, ours=True)
        for policy in {auto, "float32"}
    }
    extra = ["trainer.epochs=1"] if sizes is SMOKE else []
    demo = {policy: _demo_run(folder, 0, policy, extra) for policy in ("auto", "float32")}
    return [
        Row(
            f"VGG19 training {sizes.image}x{sizes.image}, trainer.precision=auto ({auto}: {reason}) vs float32",
            step[auto],
            step["float32"],
            "img/s",
            None,
        ),
        Row(
            f"Digits demo seconds of training, seed 0: auto ({demo['auto'][2]}; test accuracy {demo['auto'][0]:.2f}%) "
            f"vs float32 ({demo['float32'][0]:.2f}%)",
            demo["auto"][1],
            demo["float32"][1],
            "s",
            1.05,
            higher_is_better=False,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script runs")
    args = parser.parse_args(argv)
    import tensorflow as tf

    from benchmarks.__main__ import text_table
    from benchmarks.serving import serving

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.cpu_smoke:
        print("error: no GPU visible to TensorFlow; on a CPU, run with --cpu-smoke", file=sys.stderr)
        return 1
    sizes = SMOKE if args.cpu_smoke else FULL
    device = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "CPU"
    print(f"# device: {device}; sizes: {sizes}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vggtrain-gpu-") as folder:
        rows, fastest = training_rows(sizes, bool(gpus))
        rows += input_rows(sizes, Path(folder), fastest)
        rows += precision_rows(sizes, Path(folder))
        rows += serving(Path(folder), quick=args.cpu_smoke)
    print(text_table(rows))
    print(f"# {device}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
