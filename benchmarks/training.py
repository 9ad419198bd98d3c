"""Training rows: what the run.py path costs a training step against plain Keras, what the model's own
preprocessing costs, and whether the demo's input pipeline keeps up with its model.

    python -m benchmarks --only trainer_overhead model_preprocessing input_bound augmentation_cost data_digest
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import TRAINING_ROUNDS, Row, demo_model, fit_rate
from benchmarks.pipelines import CIFAR_MODEL


def trainer_overhead(folder: Path, quick: bool) -> list[Row]:
    import keras
    import tensorflow as tf

    from trainer.config.groups import ScheduleConfig
    from trainer.runs.checkpoints import ModelInfo
    from trainer.training.callbacks import RunFiles, training_callbacks
    from trainer.training.optimizers import build_learning_rate, build_optimizer

    rng = np.random.default_rng(0)
    images = rng.normal(size=(512, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 512).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(64).repeat().cache()
    steps = 8 if quick else 100  # epochs long enough that epoch-end saves weigh as little as in real runs
    keras.utils.set_random_seed(0)
    plain = demo_model()
    plain.compile(
        keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    keras.utils.set_random_seed(0)
    ours = demo_model()
    schedule = build_learning_rate(ScheduleConfig(name="cosine").target, 0.01, steps, 3, warmup_epochs=1.0)
    ours.compile(
        build_optimizer("keras.optimizers.SGD", schedule, {"momentum": 0.9}),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    validation = tf.data.Dataset.from_tensor_slices((images[:64], labels[:64])).batch(64)

    info = ModelInfo(tuple(str(index) for index in range(10)), 32, 32, "none")
    run_dir = folder / "overhead"
    callbacks = training_callbacks(RunFiles(run_dir, run_dir / "backup", ours, info, "val_accuracy", "max"))
    # Alternating rounds, best of each: this machine's noise is larger than the difference sought.
    results = {"plain": [], "ours": []}
    for _ in range(1 if quick else TRAINING_ROUNDS):
        results["plain"].append(fit_rate(plain, dataset, steps, validation, epochs=3))
        results["ours"].append(fit_rate(ours, dataset, steps, validation, callbacks, epochs=3))
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


def model_preprocessing(folder: Path, quick: bool) -> list[Row]:
    """A VGG19 training step with the preprocessing in the model (uint8 in: cast, flip, colour jitter, standardize)
    against the same network fed images already preprocessed to float32."""
    import keras
    import tensorflow as tf

    from trainer.data.augmentation import Augmentation
    from trainer.models.preprocessing import build_models

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (512, 32, 32, 3)).astype(np.uint8)
    labels = rng.integers(0, 10, 512).astype(np.int32)
    standardized = tf.image.per_image_standardization(pixels.astype(np.float32)).numpy()
    datasets = {
        "floats": tf.data.Dataset.from_tensor_slices((standardized, labels)).batch(64).repeat().cache(),
        "in_model": tf.data.Dataset.from_tensor_slices((pixels, labels)).batch(64).repeat().cache(),
    }
    models = {}
    for name in datasets:
        keras.utils.set_random_seed(0)
        models[name] = demo_model()
        if name == "in_model":
            models[name] = build_models(models[name], "standardize", Augmentation(**CIFAR_MODEL), seed=0).training
        models[name].compile(
            keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    steps = 10 if quick else 40
    rates = {name: [] for name in datasets}
    # Alternating rounds, best of each; two more than the other rows: the cost sought (~2%) is within one
    # round's noise here (the same model measured 0.88 to 1.02 of the float feed in one 3-round run).
    for _ in range(1 if quick else TRAINING_ROUNDS + 2):
        for name, dataset in datasets.items():
            rates[name].append(fit_rate(models[name], dataset, steps, epochs=3)[0])
    return [
        Row(
            "Training step: preprocessing in the model (uint8 in) vs fed float32",
            max(rates["in_model"]),
            max(rates["floats"]),
            "img/s",
            0.97,
        )
    ]


def input_bound(folder: Path, quick: bool) -> list[Row]:
    import keras
    import tensorflow as tf

    from trainer.config.resolvers import bundled_data
    from trainer.data import pipeline
    from trainer.data.augmentation import Augmentation
    from trainer.data.binary import BinaryLayout
    from trainer.data.cache import Cache
    from trainer.data.decoders import BinaryDecoder
    from trainer.data.preprocess import Preprocess
    from trainer.data.shares import Records
    from trainer.data.sources import FixedLengthReader, Source
    from trainer.models.preprocessing import build_models

    layout = BinaryLayout(8, 8, 1)
    path = Path(bundled_data("digits")) / "train.bin"
    # The demo's training split: the file's records less the 200 that conf/dataset/digits.yaml holds out for val.
    count = path.stat().st_size // layout.record_bytes - 200
    source = Source(Records(((str(path), 0, count),), count), FixedLengthReader(layout.record_bytes))
    preprocess = Preprocess(32, Augmentation(crop="pad", padding=2))
    real = pipeline.train_dataset(source, BinaryDecoder(layout, 10), preprocess, 64, 0, 2000, cache=Cache("memory"))
    cached = (
        tf.data.Dataset.from_tensor_slices(tuple(tf.stack(parts) for parts in zip(*list(real.take(19)), strict=True)))
        .repeat()
        .cache()
    )
    steps = 10 if quick else 40
    models = {}
    for name in ("cached", "real"):
        keras.utils.set_random_seed(0)
        models[name] = build_models(demo_model()).training  # the pipeline yields uint8, as run.py's does
        models[name].compile(
            keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    # Alternating rounds, best of each: this machine's noise is larger than the difference sought.
    rates = {"cached": [], "real": []}
    for _ in range(1 if quick else TRAINING_ROUNDS):
        for name, dataset in (("cached", cached), ("real", real)):
            rates[name].append(fit_rate(models[name], dataset, steps, epochs=3)[0])
    return [Row("Input-bound check (real pipeline vs cached)", max(rates["real"]), max(rates["cached"]), "img/s", 0.97)]


def augmentation_cost(folder: Path, quick: bool) -> list[Row]:
    """What a training step of the demo's VGG19 (quarter width, CIFAR's flip and colour jitter in the model) costs
    with Keras's RandAugment in the model, and with MixUp/CutMix on the host, against neither; side by side."""
    import keras
    import tensorflow as tf

    from trainer.data.augmentation import Augmentation, Policy
    from trainer.data.mixing import Mixing, batch_mixer
    from trainer.models.preprocessing import build_models
    from trainer.training.losses import build_loss
    from trainer.training.metrics import training_metrics

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (512, 32, 32, 3)).astype(np.uint8)
    labels = rng.integers(0, 10, 512).astype(np.int32)
    plain = tf.data.Dataset.from_tensor_slices((pixels, labels)).batch(64).cache().repeat()
    mix = batch_mixer(Mixing(10, mixup_alpha=0.8, cutmix_alpha=1.0))
    seeds = tf.data.Dataset.random(seed=1)
    mixed = tf.data.Dataset.zip((plain, seeds)).map(
        lambda batch, seed: mix(*batch, seed), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    variants = {
        "none": (Augmentation(**CIFAR_MODEL), plain, False),
        "randaugment": (Augmentation(**CIFAR_MODEL, policy=Policy.randaugment), plain, False),
        "mixing": (Augmentation(**CIFAR_MODEL), mixed.prefetch(tf.data.AUTOTUNE), True),
    }
    models = {}
    for name, (augment, _, soft) in variants.items():
        keras.utils.set_random_seed(0)
        models[name] = build_models(demo_model(), "standardize", augment, seed=0, float_input=soft).training
        models[name].compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=build_loss(0.0, soft),
            metrics=training_metrics(soft),
        )
    steps = 8 if quick else 40
    rates = {name: [] for name in variants}
    for _ in range(1 if quick else TRAINING_ROUNDS):  # alternating rounds, best of each
        for name, (_, dataset, _) in variants.items():
            rates[name].append(fit_rate(models[name], dataset, steps, epochs=3)[0])
    return [
        Row(
            "Training step: RandAugment in the model vs none",
            max(rates["randaugment"]),
            max(rates["none"]),
            "img/s",
            None,
        ),  # fmt: skip
        Row(
            "Training step: MixUp/CutMix on the host vs none", max(rates["mixing"]), max(rates["none"]), "img/s", None
        ),  # fmt: skip
    ]


def data_digest(folder: Path, quick: bool) -> list[Row]:
    """The whole-file checksum a run computes beside its first epoch (`trainer.runs.digest`) against one epoch of
    the CIFAR recipe (VGG19 at 28x28, batch 128), extrapolated from timed training steps: the share of the
    first epoch the check adds at most (its thread takes one core while it runs)."""
    import time

    import keras

    from benchmarks.common import cifar_count, cifar_files
    from trainer.models.vgg19 import build_vgg19
    from trainer.runs.digest import FileDigests

    records = cifar_count(quick)
    files = cifar_files(folder, records)
    started = time.perf_counter()
    FileDigests(files).wait()
    digest_seconds = time.perf_counter() - started

    keras.utils.set_random_seed(0)
    model = build_vgg19(10, (28, 28, 3))
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    images = rng.normal(size=(128, 28, 28, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 128)
    model.train_on_batch(images, labels)  # tracing
    steps = 2 if quick else 6
    started = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(images, labels)
    epoch_seconds = (time.perf_counter() - started) / steps * (50000 // 128)
    figure = f"Whole-file data checksum ({records:,} CIFAR records) vs one CIFAR VGG19 epoch"
    return [Row(figure, digest_seconds, epoch_seconds, "s", 0.05, higher_is_better=False)]
