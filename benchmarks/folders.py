"""Folder rows: the `dataset=folder` train pipeline against `keras.utils.image_dataset_from_directory` on the same
folder of JPEGs, camera-size and phone-size.

    python -m benchmarks --only folder_pipeline

Both read `DIR/train/<class>/`, shuffle, decode, resize to 224 and batch 32; images per
second over a fixed number of batches after a warm-up. Ours decodes with the one decode
(`trainer.data.decode`: accurate DCT, reduced DCT scale for big JPEGs, EXIF, area-averaged
resize) and yields uint8; the baseline decodes at full size with the fast DCT and a plain
bilinear resize, and yields float32 (the third row gives it our area-averaged resize, so
that only the accurate DCT and the EXIF orientation are ours alone). Our start-up decode of
every file (the check) is outside the timed loop, as the baseline's file listing is.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, Row

BATCH_SIZE = 32
IMAGE_SIZE = 224
CLASSES = ("class_a", "class_b")
NOISE = 6.0  # sensor-like noise (standard deviation, levels): a 4000x3000 file at quality 90 is ~2.5 MB
# (width, height, train images, val images, warm-up batches, timed batches, rounds) per mode (quick: True).
CAMERA = {True: (500, 375, 64, 16, 2, 4, 1), False: (500, 375, 320, 64, 3, 30, 3)}
PHONE = {True: (4000, 3000, 16, 2, 1, 2, 1), False: (4000, 3000, 48, 8, 2, 12, 3)}


def photos(rng: np.random.Generator, width: int, height: int, count: int):
    """`count` photo-like uint8 images: a smooth colour gradient of its own each, over one shared noise field."""
    noise = rng.standard_normal((height, width, 3), dtype=np.float32) * np.float32(NOISE)
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    columns = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    for _ in range(count):
        corner, down, right = rng.uniform(-127, 127, (3, 3)).astype(np.float32)
        yield np.clip(128 + corner / 2 + down * rows + right * columns + noise, 0, 255).astype(np.uint8)


def jpeg_folder(folder: Path, width: int, height: int, num_train: int, num_val: int) -> Path:
    """`DIR/{train,val}/<class>/` of quality-90 JPEGs, half of each split per class (made once per folder)."""
    from PIL import Image

    root = folder / f"jpeg_{width}x{height}_{num_train}_{num_val}"
    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    for split, count in (("train", num_train), ("val", num_val)):
        for index, pixels in enumerate(photos(rng, width, height, count)):
            path = root / split / CLASSES[index % 2] / f"{index:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path, "JPEG", quality=90)
    (root / "done").touch()
    return root


def our_folder_train(root: Path):
    """The train pipeline `python run.py dataset=folder dataset.data_dir=ROOT dataset.augment.flip=false` builds."""
    from hydra import compose, initialize_config_dir

    from trainer.config import register, to_settings
    from trainer.tasks.data import load_data

    register()
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.augment.flip=false", "output_dir=unused"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        settings = to_settings(compose("config", overrides=overrides))
    return load_data(settings.dataset, batch_size=BATCH_SIZE, seed=0).train


def keras_folder_train(root: Path, interpolation: str = "bilinear"):
    """The textbook: `image_dataset_from_directory` over the same train folder, endless."""
    import keras
    import tensorflow as tf

    dataset = keras.utils.image_dataset_from_directory(
        root / "train",
        image_size=(IMAGE_SIZE, IMAGE_SIZE),
        batch_size=BATCH_SIZE,
        shuffle=True,
        seed=0,
        interpolation=interpolation,
    )
    return dataset.repeat().prefetch(tf.data.AUTOTUNE)  # repeat: a small folder runs out of batches


def batch_rate(dataset, warmup: int, batches: int) -> float:
    """Images per second over `batches` batches, after `warmup` batches (files listed, buffers filled)."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    images, started = 0, time.perf_counter()
    for _ in range(batches):
        images += int(next(iterator)[1].shape[0])
    return images / (time.perf_counter() - started)


def _measure(folder: Path, width: int, height: int, num_train: int, num_val: int, *timing: int, resize="bilinear"):
    """(ours, baseline) images/s on one folder, best of alternating rounds: this machine's noise hits both alike."""
    warmup, batches, rounds = timing
    root = jpeg_folder(folder, width, height, num_train, num_val)
    ours, baseline = our_folder_train(root), keras_folder_train(root, resize)
    rates = {"ours": [], "baseline": []}
    for _ in range(rounds):
        rates["baseline"].append(batch_rate(baseline, warmup, batches))
        rates["ours"].append(batch_rate(ours, warmup, batches))
    return max(rates["ours"]), max(rates["baseline"])


def folder_pipeline(folder: Path, quick: bool) -> list[Row]:
    return [
        Row(
            "dataset=folder vs image_dataset_from_directory, 500x375 JPEG -> 224",
            *_measure(folder, *CAMERA[quick]),
            "img/s",
            1.0,
        ),
        Row(
            "dataset=folder vs image_dataset_from_directory, 4000x3000 JPEG phone photos -> 224",
            *_measure(folder, *PHONE[quick]),
            "img/s",
            2.0,
        ),
        Row(  # the same resize on both sides: how much of the first row's gap is our area-averaged resize
            "dataset=folder vs image_dataset_from_directory(interpolation='area'), 500x375 JPEG -> 224",
            *_measure(folder, *CAMERA[quick], resize="area"),
            "img/s",
            None,
        ),
    ]
