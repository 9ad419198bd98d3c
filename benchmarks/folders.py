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

    python -m benchmarks --only folder_cache

The same against ours from its second epoch on (`dataset.cache=auto`: the photos decoded
once and kept in memory), and a second run's first epoch against the first run's
(`dataset.cache=disk`: the first decodes and writes, the second reads).

    python -m benchmarks --only folder_search_decodes

A 16-trial search on one folder, counted: every photo decode (the one decode's image
function, wrapped) over 16 trials run one after another in this process, each as a trial
uses its data (the start-up check, a training epoch, the validation pass, the test
evaluation), against the number of photos: the target is each photo decoded once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
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


def our_folder_train(root: Path, *extra: str):
    """The train pipeline `python run.py dataset=folder dataset.data_dir=ROOT dataset.augment.flip=false
    dataset.augment.crop=none EXTRA` builds (`dataset.cache=off`: each epoch decodes, as the first does)."""
    return our_folder_data(root, *extra).train()


def our_folder_data(root: Path, *extra: str):
    """The data of `python run.py dataset=folder dataset.data_dir=ROOT dataset.augment.flip=false
    dataset.augment.crop=none EXTRA` (no augmentation, as image_dataset_from_directory has none): the folder
    listed and every file checked; each pipeline is built when first read."""
    from hydra import compose, initialize_config_dir

    from trainer.config import register, to_settings
    from trainer.tasks.data import load_data

    register()
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "output_dir=unused"]
    overrides += ["dataset.augment.flip=false", "dataset.augment.crop=none"]  # the photo recipe's crop too
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        settings = to_settings(compose("config", overrides=[*overrides, *extra]))
    return load_data(settings.dataset, batch_size=BATCH_SIZE, seed=0)


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
    """Images per second over `batches` batches, after `warmup` batches (files listed, buffers filled); a
    dataset's iterator goes on where it was (a cache filled in the warm-up stays filled, as in `fit`)."""
    iterator = dataset if hasattr(dataset, "__next__") else iter(dataset)
    for _ in range(warmup):
        next(iterator)
    images, started = 0, time.perf_counter()
    for _ in range(batches):
        images += int(next(iterator)[1].shape[0])
    return images / (time.perf_counter() - started)


def _measure(
    folder: Path, width: int, height: int, num_train: int, num_val: int, *timing: int, resize="bilinear", cache="off"
):
    """(ours, baseline) images/s on one folder, best of alternating rounds: this machine's noise hits both alike.
    With a `dataset.cache` other than off, ours is timed from its second epoch (the warm-up reads the first)."""
    warmup, batches, rounds = timing
    root = jpeg_folder(folder, width, height, num_train, num_val)
    ours = our_folder_train(root, f"dataset.cache={cache}", f"dataset.cache_dir={folder / 'cache'}")
    baseline = keras_folder_train(root, resize)
    if cache != "off":  # one iterator, as `fit` keeps: its first epoch decodes every photo once, then keeps them
        ours = iter(ours)
        batch_rate(ours, -(-num_train // BATCH_SIZE), 0)
    rates = {"ours": [], "baseline": []}
    for _ in range(rounds):
        rates["baseline"].append(batch_rate(baseline, warmup, batches))
        rates["ours"].append(batch_rate(ours, warmup, batches))
    return max(rates["ours"]), max(rates["baseline"])


def first_epoch_seconds(root: Path, cache_dir: Path, num_train: int) -> float:
    """Seconds for one epoch of a new run's `dataset=folder dataset.cache=disk` pipeline, its building (where the
    cache is written, or found) included; the start-up check of every file is not (each run makes it)."""
    data = our_folder_data(root, "dataset.cache=disk", f"dataset.cache_dir={cache_dir}")
    started = time.perf_counter()
    batch_rate(data.train(), -(-num_train // BATCH_SIZE), 0)
    return time.perf_counter() - started


def folder_cache(folder: Path, quick: bool) -> list[Row]:
    """Decoded once (`dataset.cache`): epochs after the first, and a second run's first epoch."""
    rows = []
    for name, shape, target in (("4000x3000 JPEG phone photos", PHONE, 5.0), ("500x375 JPEG", CAMERA, 2.0)):
        rows.append(
            Row(
                f"dataset=folder epochs 2+ (dataset.cache=auto, in memory) vs image_dataset_from_directory, {name} "
                "-> 224",
                *_measure(folder, *shape[quick], cache="auto"),
                "img/s",
                target,
            )
        )
    width, height, num_train, num_val = PHONE[quick][:4]
    root = jpeg_folder(folder, width, height, num_train, num_val)
    first = first_epoch_seconds(root, folder / "second_run_cache", num_train)  # decodes, writes the cache
    second = first_epoch_seconds(root, folder / "second_run_cache", num_train)  # reads it
    rows.append(
        Row(
            "dataset=folder second run's first epoch vs the first run's (dataset.cache=disk), 4000x3000 phone photos",
            num_train / second,
            num_train / first,
            "img/s",
            5.0,
        )
    )
    return rows


def folder_pipeline(folder: Path, quick: bool) -> list[Row]:
    """First epochs (every photo decoded), at the floor JPEG decoding sets: `dataset.cache=off`."""
    return [
        Row(  # reported: the baseline's plain bilinear resize is less work (and aliases); issue 53 restated this
            # row at the floor as the like-for-like one below
            "dataset=folder vs image_dataset_from_directory, 500x375 JPEG -> 224",
            *_measure(folder, *CAMERA[quick]),
            "img/s",
            None,
        ),
        Row(
            "dataset=folder vs image_dataset_from_directory, 4000x3000 JPEG phone photos -> 224",
            *_measure(folder, *PHONE[quick]),
            "img/s",
            1.4,  # the 1/8-scale decode is the floor per photo (27.9 ms for 12 MP here)
        ),
        Row(  # the same resize on both sides: how much of the first row's gap is our area-averaged resize
            "dataset=folder vs image_dataset_from_directory(interpolation='area'), 500x375 JPEG -> 224",
            *_measure(folder, *CAMERA[quick], resize="area"),
            "img/s",
            0.95,  # like for like: the accurate DCT and EXIF are what is left of ours
        ),
    ]


TRIALS = 16
# (width, height, train images, val images): small photos, as only the count of decodes is measured.
SEARCH_FOLDER = {True: (160, 120, 16, 8), False: (320, 240, 48, 16)}


def _counting_decodes():
    """Wraps the one decode's per-image function (`trainer.data.decode._decode_one`, which every path calls:
    the folder check, the training and evaluation pipelines) so that each image it decodes counts once, in the
    graph. Returns the counter, a one-element list."""
    import tensorflow as tf

    from trainer.data import decode

    count, lock, original = [0], threading.Lock(), decode._decode_one

    def tick():
        with lock:
            count[0] += 1
        return np.int64(count[0])

    def counted(data, *arguments, **options):
        image = original(data, *arguments, **options)
        with tf.control_dependencies([tf.numpy_function(tick, [], tf.int64, stateful=True)]):
            return tf.identity(image)

    decode._decode_one = counted
    decode._batch_decoder.cache_clear()  # traced again, with the counter inside
    decode._image_decoder.cache_clear()
    return count


def _trial(root: Path, cache: str, cache_dir: Path, steps: int) -> None:
    """What one trial of a search does with its data, without the model: the start-up check, one training epoch,
    the validation pass and the test evaluation."""
    data = our_folder_data(root, f"dataset.cache={cache}", f"dataset.cache_dir={cache_dir}", "dataset.image_size=32")
    iterator = iter(data.train())
    for _ in range(steps):
        next(iterator)
    for split in (data.split("val"), data.split("test")):
        for _ in split:
            pass


def _search_decodes(root: Path, count: list[int], steps: int, cache: str, keep_verdicts: bool) -> int:
    """Decodes (`count`, from `_counting_decodes`) over `TRIALS` trials on `root`, the caches of this search in
    a new temporary folder; without `keep_verdicts`, the check's kept verdicts are removed before each trial."""
    before = count[0]
    with tempfile.TemporaryDirectory(prefix="vggtrain-search-") as temporary:
        os.environ["XDG_CACHE_HOME"] = str(Path(temporary) / "xdg")  # the check's verdicts: this search's own
        for _ in range(TRIALS):
            if not keep_verdicts:
                shutil.rmtree(Path(temporary) / "xdg", ignore_errors=True)
            _trial(root, cache, Path(temporary) / "decoded", steps)
    return count[0] - before


def folder_search_decodes(folder: Path, quick: bool) -> list[Row]:
    """A 16-trial search on a folder, each photo decoded once: the decodes counted against the photos."""
    width, height, num_train, num_val = SEARCH_FOLDER[quick]
    root = jpeg_folder(folder, width, height, num_train, num_val)
    photos, steps = num_train + num_val, -(-num_train // BATCH_SIZE)
    name = f"{TRIALS} trials of a search on {photos} photos (train, val; test is val)"
    count = _counting_decodes()
    kept = _search_decodes(root, count, steps, "disk", keep_verdicts=True)
    unkept = _search_decodes(root, count, steps, "disk", keep_verdicts=False)
    memory = _search_decodes(root, count, steps, "auto", keep_verdicts=True)
    unkept_name = "the same, the check's verdicts not kept (each trial checks every photo)"
    memory_name = "the same, dataset.cache=auto (in memory: each trial fills its own)"
    return [
        Row(f"photo decodes vs photos, {name}, dataset.cache=disk", kept, photos, "decodes", 1.0, False),
        Row(unkept_name, unkept, photos, "decodes", None, False),
        Row(memory_name, memory, photos, "decodes", None, False),
    ]
