"""The benchmark rows. Each case makes its own data under `folder` and measures ours and a baseline side by side."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRAINING_ROUNDS = 3  # alternating rounds of the training rows (best of each); 2 still let noise through
# Targets, not measurements: the memory row compares the measured peak with this budget, not with a baseline run.
MEMORY_BUDGET_MIB = 1536.0  # the CIFAR pipeline must fit in 1.5 GiB (ImageNet-size shuffle buffers are out of scope)


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


def _rate(dataset, seconds: float, warmup: int = 20) -> float:
    """Images per second over at least `seconds`, after `warmup` batches (shuffle buffers filled,
    tf.data's autotuner past its first guesses)."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    images, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        images += int(next(iterator)[1].shape[0])
    return images / elapsed


def _cifar_count(quick: bool) -> int:
    return 10000 if quick else 50000


def _cifar_files(folder: Path, records: int) -> list[str]:
    path = folder / f"cifar_{records}.bin"
    if not path.exists():
        rng = np.random.default_rng(0)
        data = rng.integers(0, 256, (records, 3073), dtype=np.uint8)
        data[:, 0] %= 10
        path.write_bytes(data.tobytes())
    return [str(path)]


def _textbook_cifar(files, batch_size, seed):
    """The per-example recipe: parse, augment and standardize one image at a time, then batch."""
    import tensorflow as tf

    def parse(record):
        raw = tf.io.decode_raw(record, tf.uint8)
        image = tf.cast(tf.transpose(tf.reshape(raw[1:], [3, 32, 32]), [1, 2, 0]), tf.float32)
        image = tf.image.random_crop(image, [28, 28, 3])
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 63)
        image = tf.image.random_contrast(image, 0.2, 1.8)
        return tf.image.per_image_standardization(image), tf.cast(raw[0], tf.int32)

    records = tf.data.FixedLengthRecordDataset(files, 3073).shuffle(10000, seed=seed).repeat()
    return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(tf.data.AUTOTUNE)


CIFAR_AUGMENT = dict(crop="random", crop_size=28, flip=True, brightness=63.0, contrast_lower=0.2, contrast_upper=1.8)


def _our_cifar(folder: Path, quick: bool):
    """(files, record count, this project's CIFAR train pipeline with the full augmentation, batch 128)."""
    from trainer.data import pipeline, records
    from trainer.data.augment import Augmentation, Preprocess

    count = _cifar_count(quick)
    files = _cifar_files(folder, count)
    dataset = pipeline.train_dataset(
        records.RecordSlice(tuple(files), 0, count),
        records.RecordFormat(32, 32, 3),
        Preprocess(32, Augmentation(**CIFAR_AUGMENT)),
        128,
        seed=0,
    )
    return files, count, dataset


def cifar_pipeline(folder: Path, quick: bool) -> list[Row]:
    files, _, ours = _our_cifar(folder, quick)
    seconds = 0.5 if quick else 3.0
    baseline_rate = _rate(_textbook_cifar(files, 128, 0), seconds)
    ours_rate = _rate(ours, seconds)
    return [Row("CIFAR train pipeline (full augmentation)", ours_rate, baseline_rate, "img/s", 3.0)]


def _pet_records(folder: Path, format: str, count: int, shards: int = 4, size: int = 224) -> list[str]:
    """`count` noisy 224x224 images in `shards` files, as `python -m trainer.convert` lays them out."""
    import tensorflow as tf

    from trainer.data import tfrecords

    spec = tfrecords.RecordSpec.for_format(format, size)
    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, size * size * 3).reshape(size, size, 3)
    paths = [folder / f"pets_{format}_{count}-{shard:05d}.tfrecords" for shard in range(shards)]
    for shard, path in enumerate(paths):
        if path.exists():
            continue
        with tf.io.TFRecordWriter(str(path)) as writer:
            for index in range(shard, count, shards):
                pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
                data = pixels.tobytes() if format == "raw" else tf.io.encode_jpeg(pixels, quality=90).numpy()
                writer.write(tfrecords.make_example(spec, data, index % 2, None, size, size))
    return [str(path) for path in paths]


def _textbook_parse(format: str, augment: bool, size: int = 224):
    """The per-example recipe: `parse_single_example`, decode, and (if `augment`) flip and standardize one image."""
    import tensorflow as tf

    from trainer.data.tfrecords import DEFAULT_KEYS

    keys = DEFAULT_KEYS[format]
    description = {
        keys["image"]: tf.io.FixedLenFeature([], tf.string),
        keys["label"]: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        example = tf.io.parse_single_example(serialized, description)
        if format == "raw":
            image = tf.reshape(tf.io.decode_raw(example[keys["image"]], tf.uint8), [size, size, 3])
        else:
            image = tf.io.decode_jpeg(example[keys["image"]], channels=3)
        if augment:
            image = tf.image.random_flip_left_right(tf.cast(image, tf.float32))
            image = tf.image.per_image_standardization(image)
        return image, tf.cast(example[keys["label"]], tf.int32)

    return parse


def _textbook_reader(records, format: str, batch_size: int, augment: bool):
    import tensorflow as tf

    parsed = records.map(_textbook_parse(format, augment), num_parallel_calls=tf.data.AUTOTUNE)
    return parsed.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _textbook_records(files):
    """The textbook's reading: the files one after another, then a shuffle buffer."""
    import tensorflow as tf

    return tf.data.TFRecordDataset(files).shuffle(256, seed=0).repeat()


def _side_by_side(ours, baseline, seconds: float, rounds: int) -> tuple[float, float]:
    """(ours, baseline) images/s, best of `rounds` alternating rounds: this machine's noise hits both alike."""
    rates = {"ours": [], "baseline": []}
    for _ in range(rounds):
        rates["baseline"].append(_rate(baseline, seconds))
        rates["ours"].append(_rate(ours, seconds))
    return max(rates["ours"]), max(rates["baseline"])


def tfrecord_reader(folder: Path, quick: bool) -> list[Row]:
    """The reader (records to uint8 batches with labels): the indexed one for local raw files, TFRecordDataset's
    for JPEG records and for remote raw files; and the train pipeline on top of the raw reader."""
    import tensorflow as tf

    from trainer.data import tfrecords
    from trainer.data.augment import Augmentation, Preprocess

    seconds, rounds, count = (0.5, 1, 256) if quick else (3.0, 2, 1024)
    rows, textbook = [], {}
    for format, target in (("raw", 2.0), ("jpeg", None)):
        files = _pet_records(folder, format, count)
        spec = tfrecords.RecordSpec.for_format(format, 224)
        ours, textbook[format] = _side_by_side(
            tfrecords.read_batches(files, spec, 32, 0, 256).prefetch(tf.data.AUTOTUNE),
            _textbook_reader(_textbook_records(files), format, 32, augment=False),
            seconds,
            rounds,
        )
        rows.append(Row(f"Cats-vs-Dogs reader 224x224 {format}", ours, textbook[format], "img/s", target))

    files = _pet_records(folder, "raw", count)
    spec = tfrecords.RecordSpec.for_format("raw", 224)
    rates = _side_by_side(
        tfrecords.image_batches(tfrecords.shuffled_records(files, 0, 256), spec, True, 32, True).prefetch(-1),
        _textbook_reader(_textbook_records(files), "raw", 32, augment=False),
        seconds,
        rounds,
    )
    rows.append(Row("  raw through TFRecordDataset + parse_example (remote files)", *rates, "img/s", None))
    rates = _side_by_side(
        tfrecords.train_dataset(files, spec, Preprocess(224, Augmentation(flip=True)), 2, 32, 0, 256),
        _textbook_reader(_textbook_records(files), "raw", 32, augment=True),
        seconds,
        rounds,
    )
    rows.append(Row("  + flip, standardize: train pipeline, raw", *rates, "img/s", None))
    return rows


def _demo_model():
    from trainer.models.vgg19 import build_vgg19

    return build_vgg19(
        10, (32, 32, 3), width_multiplier=0.25, fc_units=512, dropout=0.3, weight_decay=5e-4, batch_norm=True
    )


def _fit_rate(model, dataset, steps: int, validation=None, callbacks=(), epochs: int = 4) -> tuple[float, float]:
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


def trainer_overhead(folder: Path, quick: bool) -> list[Row]:
    import keras
    import tensorflow as tf

    from trainer import optim
    from trainer.callbacks import training_callbacks

    rng = np.random.default_rng(0)
    images = rng.normal(size=(512, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 512).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(64).repeat().cache()
    steps = 8 if quick else 100  # epochs long enough that epoch-end saves weigh as little as in real runs
    keras.utils.set_random_seed(0)
    plain = _demo_model()
    plain.compile(
        keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    keras.utils.set_random_seed(0)
    ours = _demo_model()
    schedule = optim.build_learning_rate("cosine", 0.01, steps, 3, warmup_epochs=1.0)
    ours.compile(
        optim.build_optimizer("sgd", schedule, 0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    validation = tf.data.Dataset.from_tensor_slices((images[:64], labels[:64])).batch(64)

    callbacks = training_callbacks(folder / "overhead", "val_accuracy", "max", folder / "overhead" / "backup")
    # Alternating rounds, best of each: this machine's noise is larger than the difference sought.
    results = {"plain": [], "ours": []}
    for _ in range(1 if quick else TRAINING_ROUNDS):
        results["plain"].append(_fit_rate(plain, dataset, steps, validation, epochs=3))
        results["ours"].append(_fit_rate(ours, dataset, steps, validation, callbacks, epochs=3))
    baseline, baseline_end = max(results["plain"])
    mine, mine_end = max(results["ours"])
    return [
        Row("Trainer overhead per step (run.py path vs plain Keras)", mine, baseline, "img/s", 0.97),
        Row(
            "Epoch end: validation + checkpoints, backup, plots (run.py vs plain)",
            mine_end,
            baseline_end,
            "s",
            None,
            higher_is_better=False,
        ),
    ]


def input_bound(folder: Path, quick: bool) -> list[Row]:
    import keras
    import tensorflow as tf

    from trainer.config import bundled_data
    from trainer.data import pipeline, records
    from trainer.data.augment import Augmentation, Preprocess

    fmt = records.RecordFormat(8, 8, 1)
    path = Path(bundled_data("digits")) / "train.bin"
    # The demo's training split: the file's records less the 200 that conf/dataset/digits.yaml holds out for val.
    source = records.RecordSlice((str(path),), 0, path.stat().st_size // fmt.record_bytes - 200)
    real = pipeline.train_dataset(
        source, fmt, Preprocess(32, Augmentation(crop="pad", padding=2)), 64, 0, 2000, cache=True
    )
    cached = (
        tf.data.Dataset.from_tensor_slices(tuple(tf.stack(parts) for parts in zip(*list(real.take(19)), strict=True)))
        .repeat()
        .cache()
    )
    steps = 10 if quick else 40
    models = {}
    for name in ("cached", "real"):
        keras.utils.set_random_seed(0)
        models[name] = _demo_model()
        models[name].compile(
            keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    # Alternating rounds, best of each: this machine's noise is larger than the difference sought.
    rates = {"cached": [], "real": []}
    for _ in range(1 if quick else TRAINING_ROUNDS):
        for name, dataset in (("cached", cached), ("real", real)):
            rates[name].append(_fit_rate(models[name], dataset, steps, epochs=3)[0])
    return [Row("Input-bound check (real pipeline vs cached)", max(rates["real"]), max(rates["cached"]), "img/s", 0.97)]


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_memory(folder: Path, quick: bool) -> tuple[float, list[float]]:
    """(peak RSS, RSS after each epoch) in MiB over 5 epochs of the CIFAR train pipeline, in this process."""
    _, count, dataset = _our_cifar(folder, quick)
    steps = count // 128
    iterator = iter(dataset)
    after_epoch = []
    for _ in range(5):
        for _ in range(steps):
            next(iterator)
        after_epoch.append(_rss_mib())
    return _peak_rss_mib(), after_epoch


def _peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM). Not `ru_maxrss`: a child started by fork keeps its parent's maximum."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def memory(folder: Path, quick: bool) -> list[Row]:
    # A fresh process whose peak RSS holds only the pipeline: not this one's (making the data peaks at
    # twice the 154 MB file), nor, when the cases share a process, an earlier row's.
    _cifar_files(folder, _cifar_count(quick))
    probe = (
        "import pathlib, sys; from benchmarks.cases import measure_memory; "
        "print(measure_memory(pathlib.Path(sys.argv[1]), sys.argv[2] == '1'))"
    )
    command = [sys.executable, "-c", probe, str(folder), str(int(quick))]
    output = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    peak, after_epoch = ast.literal_eval(output.strip().splitlines()[-1])
    return [
        Row(
            "Memory: peak RSS, 5 epochs CIFAR pipeline (baseline column = the 1.5 GiB budget, a target)",
            peak,
            MEMORY_BUDGET_MIB,
            "MiB",
            1.0,
            higher_is_better=False,
        ),
        Row(
            "Memory: RSS after epoch 5 vs after epoch 2",
            after_epoch[4],
            after_epoch[1],
            "MiB",
            1.05,
            higher_is_better=False,
        ),
    ]


def _time_until(command: list[str], marker: str | None, cwd: Path) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    elapsed = None
    for line in process.stdout:
        if marker and marker in line and elapsed is None:
            elapsed = time.perf_counter() - started
    process.wait()
    if process.returncode:
        raise RuntimeError(f"{command} failed with exit code {process.returncode}")
    return elapsed if marker else time.perf_counter() - started


def startup(folder: Path, quick: bool) -> list[Row]:
    run = [sys.executable, str(ROOT / "run.py"), "debug=smoke", f"hydra.run.dir={folder / 'startup'}"]
    first_step = min(_time_until(run, "First training step", folder) for _ in range(1 if quick else 2))
    imports = min(
        _time_until([sys.executable, "-c", "import tensorflow, keras"], None, folder) for _ in range(1 if quick else 2)
    )
    return [
        Row(
            "Start-up: run.py debug=smoke to first step vs import tensorflow, keras",
            first_step,
            imports,
            "s",
            None,
            higher_is_better=False,
        )
    ]


def _photos(folder: Path, count: int) -> Path:
    from PIL import Image

    root = folder / "photos"
    if not root.exists():
        rng = np.random.default_rng(0)
        gradient = np.linspace(0, 200, 500 * 375 * 3).reshape(375, 500, 3)
        for label, name in enumerate(("Cat", "Dog")):
            (root / name).mkdir(parents=True)
            for index in range(count // 2):
                pixels = np.clip(gradient + rng.normal(0, 25, gradient.shape) + label * 30, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / name / f"{index}.jpg", quality=90)
    return root


def converter(folder: Path, quick: bool) -> list[Row]:
    import tensorflow  # noqa: F401  # imported before timing: the writer needs it, the workers do not

    from trainer.convert import ConvertOptions, convert

    count = 60 if quick else 3000  # enough that starting the worker processes (~0.5 s, spawn) weighs little
    photos = _photos(folder, count)
    many = os.cpu_count() or 1
    # Alternating rounds, best of each: one round each let this machine's noise through (1.64 once, 1.81-1.92 else).
    rates = {1: [], many: []}
    for round in range(1 if quick else TRAINING_ROUNDS):
        for workers in rates:
            output = folder / f"converted_{workers}_{round}"
            started = time.perf_counter()
            convert(photos, output, ConvertOptions(image_size=224, workers=workers))
            rates[workers].append(count / (time.perf_counter() - started))
            shutil.rmtree(output)
    return [
        Row(f"Converter: {many} workers vs 1 (500x375 JPEG -> 224 raw)", max(rates[many]), max(rates[1]), "img/s", 1.7)
    ]


CASES = {
    "cifar_pipeline": cifar_pipeline,
    "tfrecord_reader": tfrecord_reader,
    "trainer_overhead": trainer_overhead,
    "input_bound": input_bound,
    "memory": memory,
    "startup": startup,
    "converter": converter,
}
