"""What every benchmark row shares: the `Row`, side-by-side rates, and the data the cases make for themselves."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRAINING_ROUNDS = 3  # alternating rounds of the training rows (best of each); 2 still let noise through


@dataclass
class Row:
    figure: str
    ours: float
    baseline: float
    unit: str
    target: float | None  # on the ratio ours / baseline; None: reported only
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else float("inf")

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target

    @property
    def target_text(self) -> str:
        return "report" if self.target is None else f"{'>=' if self.higher_is_better else '<='} {self.target:g}"


def rate(dataset, seconds: float, warmup: int = 20) -> float:
    """Images per second over at least `seconds`, after `warmup` batches (shuffle buffers filled,
    tf.data's autotuner past its first guesses)."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    images, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        images += int(next(iterator)[1].shape[0])
    return images / elapsed


def cifar_count(quick: bool) -> int:
    return 10000 if quick else 50000


def cifar_files(folder: Path, records: int) -> list[str]:
    path = folder / f"cifar_{records}.bin"
    if not path.exists():
        rng = np.random.default_rng(0)
        data = rng.integers(0, 256, (records, 3073), dtype=np.uint8)
        data[:, 0] %= 10
        path.write_bytes(data.tobytes())
    return [str(path)]


def side_by_side(ours, baseline, seconds: float, rounds: int) -> tuple[float, float]:
    """(ours, baseline) images/s, best of `rounds` alternating rounds: this machine's noise hits both alike."""
    rates = {"ours": [], "baseline": []}
    for _ in range(rounds):
        rates["baseline"].append(rate(baseline, seconds))
        rates["ours"].append(rate(ours, seconds))
    return max(rates["ours"]), max(rates["baseline"])


def pet_records(folder: Path, format: str, count: int, shards: int = 4, size: int = 224) -> list[str]:
    """`count` noisy 224x224 images in `shards` files, as `python -m trainer.convert` lays them out."""
    import tensorflow as tf

    from trainer.data import tfrecords

    spec = tfrecords.RecordSpec.for_format(format, size)
    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, size * size * 3).reshape(size, size, 3)
    paths = [folder / f"pets_{format}_{count}_{shards}-{shard:05d}.tfrecords" for shard in range(shards)]
    for shard, path in enumerate(paths):
        if path.exists():
            continue
        with tf.io.TFRecordWriter(str(path)) as writer:
            for index in range(shard, count, shards):
                pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
                data = pixels.tobytes() if format == "raw" else tf.io.encode_jpeg(pixels, quality=90).numpy()
                writer.write(tfrecords.make_example(spec, data, index % 2, None, size, size))
    return [str(path) for path in paths]


def demo_model():
    from trainer.models.vgg19 import build_vgg19

    return build_vgg19(
        10, (32, 32, 3), width_multiplier=0.25, fc_units=512, dropout=0.3, weight_decay=5e-4, batch_norm=True
    )


def fit_rate(model, dataset, steps: int, validation=None, callbacks=(), epochs: int = 4) -> tuple[float, float]:
    """(training images/s over the steps, seconds per epoch spent after the last step), medians over the
    epochs after the first (tracing). The step time runs from the epoch start to the last step's end."""
    import keras

    step_times, end_times = [], []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if batch == steps - 1:
                self.last_step = time.perf_counter()
                step_times.append(self.last_step - self.started)

        def on_epoch_end(self, epoch, logs=None):
            end_times.append(time.perf_counter() - self.last_step)

    model.fit(
        dataset,
        epochs=epochs,
        steps_per_epoch=steps,
        validation_data=validation,
        verbose=0,
        callbacks=[*callbacks, EpochTimer()],
    )
    batch = int(next(iter(dataset))[1].shape[0])
    return steps * batch / float(np.median(step_times[1:])), float(np.median(end_times[1:]))
