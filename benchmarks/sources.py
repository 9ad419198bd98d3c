"""Source rows: `dataset=parquet` and `dataset=tfds` against the textbook way to feed each to Keras, and `mode=predict`
on TFRecords against `mode=evaluate` on the same records.

    python -m benchmarks --only parquet_pipeline tfds_pipeline predict_records

The parquet and tfds rows read the same 500x375 JPEGs (the Cats-vs-Dogs size) as the folder
rows, shuffle, decode, resize to 224 and batch 32, images per second after a warm-up:
- parquet: ours reads Arrow record batches and decodes in tf.data; the baseline is `datasets`'
  `with_transform` (Pillow decode and bilinear resize) and `to_tf_dataset`, which calls
  Python for every example.
- tfds: ours reads the prepared shards through the TFRecord reader and the one decode; the
  baseline is `builder.as_dataset` (TFDS's own decode) and a bilinear
  `tf.image.resize`.
- predict: both commands run in this process on the same converted JPEG records with the
  same small checkpoint, from start to end (the model loaded, every record decoded and
  predicted, the CSV or the metrics written); records per second.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, Row
from benchmarks.folders import BATCH_SIZE, IMAGE_SIZE, batch_rate, photos

CLASSES = ("class_a", "class_b")
# (train images, warm-up batches, timed batches, rounds) per mode (quick: True).
TIMING = {True: (64, 2, 4, 1), False: (320, 3, 30, 3)}
RECORDS = {True: 256, False: 2048}  # converted records predicted and evaluated
RECORD_SIZE = 64  # the converted records' side, and the checkpoint's input


def _jpegs(count: int, seed: int, width: int = 500, height: int = 375) -> list[bytes]:
    import io

    from PIL import Image

    encoded = []
    for pixels in photos(np.random.default_rng(seed), width, height, count):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def _our_train(*overrides: str):
    from hydra import compose, initialize_config_dir

    from trainer.config import register, to_settings
    from trainer.tasks.data import load_data

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        settings = to_settings(compose("config", overrides=[*overrides, "dataset.augment.flip=false", "output_dir=x"]))
    return load_data(settings.dataset, batch_size=BATCH_SIZE, seed=0).train()


def _best_of(rounds: int, warmup: int, batches: int, ours, baseline) -> tuple[float, float]:
    rates = {"ours": [], "baseline": []}
    for _ in range(rounds):
        rates["baseline"].append(batch_rate(baseline, warmup, batches))
        rates["ours"].append(batch_rate(ours, warmup, batches))
    return max(rates["ours"]), max(rates["baseline"])


def _saved_to_disk(folder: Path, count: int) -> Path:
    """A `datasets` DatasetDict (train, validation) of {image: Image(), label: ClassLabel} saved with `save_to_disk`."""
    import datasets

    root = folder / f"hf_{count}"
    if root.exists():
        return root
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})

    def split(size: int, seed: int) -> datasets.Dataset:
        images = [{"bytes": data, "path": None} for data in _jpegs(size, seed)]
        return datasets.Dataset.from_dict({"image": images, "label": [i % 2 for i in range(size)]}, features=features)

    datasets.DatasetDict({"train": split(count, 0), "validation": split(16, 1)}).save_to_disk(str(root))
    return root


def _hf_to_tf_dataset(root: Path):
    """The Hugging Face recipe: Pillow decodes and resizes in `with_transform`, `to_tf_dataset` batches."""
    import datasets
    import tensorflow as tf
    from PIL import Image

    def transform(batch):
        size = (IMAGE_SIZE, IMAGE_SIZE)
        pixels = [np.asarray(image.convert("RGB").resize(size, Image.BILINEAR)) for image in batch["image"]]
        return {"pixel_values": pixels, "label": batch["label"]}

    train = datasets.load_from_disk(str(root))["train"].with_transform(transform)
    dataset = train.to_tf_dataset(columns="pixel_values", label_cols="label", batch_size=BATCH_SIZE, shuffle=True)
    return dataset.repeat().prefetch(tf.data.AUTOTUNE)


def parquet_pipeline(folder: Path, quick: bool) -> list[Row]:
    count, warmup, batches, rounds = TIMING[quick]
    root = _saved_to_disk(folder, count)
    ours = _our_train("dataset=parquet", f"dataset.data_dir={root}")
    figures = _best_of(rounds, warmup, batches, ours, _hf_to_tf_dataset(root))
    return [Row("dataset=parquet vs datasets' to_tf_dataset, 500x375 JPEG -> 224", *figures, "img/s", 2.0)]


def _tfds_folder(folder: Path, count: int) -> Path:
    """A prepared TFDS dataset `photos` (version 1.0.0) of JPEG-encoded images, as `tfds build` writes it."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = folder / f"tfds_{count}"
    if data_dir.exists():
        return data_dir

    def split(size: int, seed: int) -> tf.data.Dataset:
        images = [tf.io.decode_jpeg(data).numpy() for data in _jpegs(size, seed)]
        labels = [i % 2 for i in range(size)]
        return tf.data.Dataset.from_tensor_slices({"image": np.stack(images), "label": labels})

    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(names=list(CLASSES)),
        }
    )
    builder = tfds.dataset_builders.TfDataBuilder(
        name="photos",
        version="1.0.0",
        data_dir=str(data_dir),
        split_datasets={"train": split(count, 0), "validation": split(16, 1)},
        features=features,
    )
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return data_dir


def _tfds_textbook(data_dir: Path):
    """`tfds.load`'s pipeline (`builder_from_directory(...).as_dataset`, as `tfds.load` builds it): TFDS decodes,
    then a bilinear resize, shuffle, batch."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(data_dir / "photos" / "1.0.0"))
    # No autocache: TFDS keeps a dataset under 250 MiB in memory once decoded, so every pass after the first
    # would only resize; the datasets users train on are larger, and ours decodes every pass too.
    read_config = tfds.ReadConfig(try_autocache=False)
    train = builder.as_dataset(split="train", shuffle_files=True, read_config=read_config)
    resized = train.map(
        lambda example: (tf.image.resize(example["image"], [IMAGE_SIZE, IMAGE_SIZE]), example["label"]),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return resized.shuffle(1000, seed=0).repeat().batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def tfds_pipeline(folder: Path, quick: bool) -> list[Row]:
    count, warmup, batches, rounds = TIMING[quick]
    data_dir = _tfds_folder(folder, count)
    ours = _our_train("dataset=tfds", f"dataset.data_dir={data_dir}", "dataset.tfds_name=photos")
    figures = _best_of(rounds, warmup, batches, ours, _tfds_textbook(data_dir))
    return [Row("dataset=tfds vs tfds.load(...).map(resize), 500x375 JPEG -> 224", *figures, "img/s", 0.95)]


def _converted(folder: Path, count: int) -> Path:
    """`python -m trainer.convert` of a class-per-folder tree of `count` JPEGs, stored as JPEG at `RECORD_SIZE`."""
    from trainer.convert import main

    output = folder / f"records_{count}"
    if output.exists():
        return output
    source = folder / f"photos_{count}"
    for index, data in enumerate(_jpegs(count, 2, 160, 120)):
        path = source / CLASSES[index % 2] / f"{index:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    arguments = [str(source), str(output), "--format", "jpeg", "--image-size", str(RECORD_SIZE)]
    if main([*arguments, "--val-fraction", "0.05", "--test-fraction", "0.9"]) != 0:
        raise RuntimeError(f"the converter failed on {source}")
    return output


def _checkpoint(folder: Path) -> Path:
    """A small model as training saves it (uint8 input, preprocessing and class names inside)."""
    import keras

    from trainer.models.preprocessing import build_models
    from trainer.models.vgg19 import build_vgg19
    from trainer.runs import checkpoints

    path = folder / "predict_records.keras"
    keras.utils.set_random_seed(0)
    model = build_vgg19(2, (RECORD_SIZE, RECORD_SIZE, 3), width_multiplier=0.125, fc_units=16, dropout=0.0)
    info = checkpoints.ModelInfo(CLASSES, RECORD_SIZE, RECORD_SIZE, "standardize")
    checkpoints.save(build_models(model).inference, path, info)
    return path


def _run_mode(mode: str, records: Path, checkpoint: Path, output: Path) -> float:
    """Seconds of one `python run.py dataset=cats_dogs mode=MODE` on the test records, in this process."""
    from hydra import compose, initialize_config_dir

    from trainer.config import register, to_settings
    from trainer.tasks.evaluate import evaluate
    from trainer.tasks.predict import predict

    register()
    overrides = [
        "dataset=cats_dogs",
        f"dataset.data_dir={records}",
        f"dataset.image_size={RECORD_SIZE}",
        f"checkpoint={checkpoint}",
        f"mode={mode}",
        f"output_dir={output}",
        "trainer.batch_size=64",
        f"predict.input={records}/test.tfrecords_*",
        f"predict.output={output}/predictions.csv",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        settings = to_settings(compose("config", overrides=overrides))
    output.mkdir(parents=True, exist_ok=True)
    (output / "predictions.csv").unlink(missing_ok=True)
    started = time.perf_counter()
    (predict if mode == "predict" else evaluate)(settings)
    return time.perf_counter() - started


def predict_records(folder: Path, quick: bool) -> list[Row]:
    records, checkpoint = _converted(folder, RECORDS[quick]), _checkpoint(folder)
    test = round(RECORDS[quick] * 0.9)
    seconds = {"predict": [], "evaluate": []}
    for round_ in range(1 if quick else 3):
        for mode in ("evaluate", "predict"):
            seconds[mode].append(_run_mode(mode, records, checkpoint, folder / f"{mode}_{round_}"))
    ours, baseline = test / min(seconds["predict"]), test / min(seconds["evaluate"])
    figure = "mode=predict vs mode=evaluate on the same JPEG TFRecords, whole command"
    return [Row(figure, ours, baseline, "img/s", 0.8)]
