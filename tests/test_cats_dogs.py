"""Image folders -> TFRecord shards -> `dataset=cats_dogs`: round trip, classic files, bad files, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import ROOT, SUBPROCESS_ENV, TINY_MODEL, check_run_metrics, compose, tfrecord_parts
from trainer.config import to_settings
from trainer.convert import main
from trainer.data import pipeline, predict_inputs, tfrecords
from trainer.data.decode import decode_image
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.data.images import reason_for
from trainer.data.preprocess import Preprocess
from trainer.errors import DataError
from trainer.tasks import run_task
from trainer.tasks.data import load_data

SIZE = 32


def _color(index: int, label: int) -> tuple[int, int, int]:
    return (index * 7) % 256, 60 + label * 120, 200 - (index * 5) % 100


def make_pets(folder: Path, per_class: int = 12, noise: float = 0.0, seed: int = 0) -> dict[tuple, int]:
    """Cat/ and Dog/ folders of images of varied sizes; returns {colour: label} of the clean ones."""
    rng = np.random.default_rng(seed)
    colours = {}
    for label, name in enumerate(("Cat", "Dog")):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            colour = _color(index + 100 * label, label)
            shape = (int(rng.integers(20, 60)), int(rng.integers(20, 60)), 3)
            pixels = np.clip(np.array(colour) + rng.normal(0, noise, shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / name / f"{index}.png")
            colours[colour] = label
    return colours


def _read_all(files, spec, labeled=True):
    source, decoder = tfrecord_parts(files, spec, labeled)
    dataset = pipeline.eval_dataset(source, decoder, Preprocess(spec.stored_size), 8)
    images, labels = zip(*[(i.numpy(), lab.numpy()) for i, lab in dataset], strict=False)
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.integration
@pytest.mark.parametrize(  # jpeg: ~12 s alone; a converted JPEG folder is read in the default suite too (below)
    "format, tolerance", [("raw", 0), pytest.param("jpeg", 3, marks=pytest.mark.slow)]
)
def test_round_trip_gives_the_same_pixels_and_labels(tmp_path, format, tolerance):
    colours = make_pets(tmp_path / "in")
    options = ConvertOptions(image_size=SIZE, format=format, val_fraction=0.25, records_per_shard=5, workers=1)
    manifest = convert(tmp_path / "in", tmp_path / "out", options)
    spec = tfrecords.RecordSpec.for_format(format, SIZE)
    seen = {}
    for split in ("train", "val"):
        files = [str(tmp_path / "out" / name) for name in manifest["splits"][split]["files"]]
        images, labels = _read_all(files, spec)
        assert len(images) == manifest["splits"][split]["count"]
        for image, label in zip(images, labels, strict=True):
            centre = tuple(int(v) for v in image[SIZE // 2, SIZE // 2])
            match = min(colours, key=lambda c: sum(abs(a - b) for a, b in zip(c, centre, strict=False)))
            assert max(abs(a - b) for a, b in zip(match, centre, strict=False)) <= tolerance
            assert np.abs(image.astype(int) - np.array(match)).max() <= tolerance, "every pixel is the source colour"
            assert colours[match] == label, "the label must be the label of the image it came with"
            seen[match] = label
        assert set(labels.tolist()) == {0, 1}, "every split mixes classes"
    assert len(seen) == len(colours)
    assert manifest["splits"]["val"]["per_class"] == {"Cat": 3, "Dog": 3}
    assert manifest["class_names"] == ["Cat", "Dog"] and manifest["format"] == format


@pytest.mark.integration
def test_jpeg_records_use_the_tfds_keys_and_are_smaller(tmp_path):
    make_pets(tmp_path / "in", per_class=4, noise=5.0)
    raw = convert(tmp_path / "in", tmp_path / "raw", ConvertOptions(image_size=64, workers=1))
    jpeg = convert(tmp_path / "in", tmp_path / "jpeg", ConvertOptions(image_size=64, format="jpeg", workers=1))
    raw_size = sum((tmp_path / "raw" / f).stat().st_size for f in raw["splits"]["train"]["files"])
    jpeg_size = sum((tmp_path / "jpeg" / f).stat().st_size for f in jpeg["splits"]["train"]["files"])
    assert jpeg_size * 2 < raw_size
    first = next(iter(tf.data.TFRecordDataset(str(tmp_path / "jpeg" / jpeg["splits"]["train"]["files"][0]))))
    keys = set(tf.train.Example.FromString(first.numpy()).features.feature)
    assert {"image/encoded", "image/class/label", "image/filename", "image/height", "image/width"} <= keys
    first_raw = next(iter(tf.data.TFRecordDataset(str(tmp_path / "raw" / raw["splits"]["train"]["files"][0]))))
    assert set(tf.train.Example.FromString(first_raw.numpy()).features.feature) == {"label", "img_raw"}


@pytest.mark.integration
def test_bad_files_are_skipped_and_reported_and_odd_ones_handled(tmp_path):
    folder = tmp_path / "in"
    make_pets(folder, per_class=3)
    cat, dog = folder / "Cat", folder / "Dog"
    (cat / "empty.jpg").write_bytes(b"")
    (cat / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 not an image")
    (dog / "notes.txt").write_text("hello")
    good = (cat / "0.png").read_bytes()
    Image.open(cat / "0.png").save(cat / "full.jpg")
    (cat / "truncated.jpg").write_bytes((cat / "full.jpg").read_bytes()[:200])
    (dog / "png_named.jpg").write_bytes(good)
    Image.fromarray(np.full((20, 30), 90, np.uint8), "L").save(dog / "gray.jpg")
    Image.new("CMYK", (20, 20), (0, 0, 0, 0)).save(dog / "cmyk.jpg")
    Image.fromarray(np.full((20, 20, 4), 90, np.uint8), "RGBA").save(dog / "alpha.png")
    Image.fromarray(np.full((20, 20), 30000, np.uint16)).save(dog / "sixteen.png")
    Image.new("P", (20, 20), 3).save(dog / "palette.gif")
    manifest = convert(folder, tmp_path / "out", ConvertOptions(image_size=SIZE, workers=2))
    skipped = {entry["file"]: entry["reason"] for entry in manifest["skipped"]}
    assert set(skipped) == {"Cat/empty.jpg", "Cat/Thumbs.db", "Dog/notes.txt", "Cat/truncated.jpg"}
    assert skipped["Cat/empty.jpg"] == "empty file"
    assert skipped["Cat/truncated.jpg"].startswith("corrupt or truncated")
    assert manifest["splits"]["train"]["count"] == 3 + 1 + 3 + 6  # clean, full.jpg, and the six odd ones
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest


def _decoded(path: Path, size: int) -> np.ndarray:
    return decode_image(tf.constant(path.read_bytes()), size).numpy()


@pytest.mark.unit
def test_pixel_modes_and_exif_orientation(tmp_path):
    sixteen = tmp_path / "sixteen.png"
    Image.fromarray(np.full((4, 4), 65535, np.uint16)).save(sixteen)
    assert _decoded(sixteen, 4).min() == 255, "16-bit white stays white, scaled not clipped"
    Image.fromarray(np.full((4, 4), 32896, np.uint16)).save(sixteen)
    assert abs(int(_decoded(sixteen, 4)[0, 0, 0]) - 128) <= 1
    # A 20x10 image (left half red, right half blue) stored with EXIF "rotate 90 CW" (orientation 6).
    pixels = np.zeros((10, 20, 3), np.uint8)
    pixels[:, :10, 0] = 255
    pixels[:, 10:, 2] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(tmp_path / "rotated.jpg", exif=exif, quality=100, subsampling=0)
    with Image.open(tmp_path / "rotated.jpg") as image:
        assert image.size == (20, 10)
    upright = _decoded(tmp_path / "rotated.jpg", 8)
    assert upright[0, 4, 0] > 200 and upright[0, 4, 2] < 50, "red on top after rotation"
    assert upright[7, 4, 2] > 200 and upright[7, 4, 0] < 50, "blue below"
    (tmp_path / "zero.jpg").write_bytes(b"")
    assert reason_for(str(tmp_path / "zero.jpg"), 8, "resize") == "empty file"


@pytest.mark.integration
def test_the_same_bytes_for_one_and_three_workers(tmp_path):
    make_pets(tmp_path / "in", per_class=10, noise=20)
    (tmp_path / "in" / "Cat" / "broken.jpg").write_bytes(b"\xff\xd8 broken")  # a skip inside a worker's shard
    for workers in (1, 3):
        for format, compression in (("raw", "none"), ("jpeg", "gzip")):
            convert(
                tmp_path / "in",
                tmp_path / f"{format}{workers}",
                ConvertOptions(
                    image_size=SIZE,
                    format=format,
                    records_per_shard=7,
                    workers=workers,
                    seed=3,
                    compression=compression,
                ),
            )
    for format in ("raw", "jpeg"):
        one = sorted((tmp_path / f"{format}1").iterdir())
        three = sorted((tmp_path / f"{format}3").iterdir())
        assert [p.name for p in one] == [p.name for p in three] and len(one) >= 4
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(one, three, strict=True))


@pytest.mark.integration
def test_converter_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--image-size",
        "--format",
        "--val-fraction",
        "--test-fraction",
        "--records-per-shard",
        "--workers",
        "--seed",
        "--classes",
        "--resize",
    ):
        assert option in text
    assert main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert "error: INPUT_DIR" in capsys.readouterr().err
    # A flat folder is an unlabeled test set that keeps each file name.
    flat = tmp_path / "flat"
    flat.mkdir()
    for index in range(3):
        Image.fromarray(np.full((10, 10, 3), index * 50, np.uint8)).save(flat / f"img{index}.png")
    assert main([str(flat), str(tmp_path / "out"), "--image-size", "16", "--workers", "1"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["labeled"] is False and manifest["splits"]["test"]["count"] == 3
    spec = tfrecords.RecordSpec.for_format("raw", 16)
    files = [str(tmp_path / "out" / name) for name in manifest["splits"]["test"]["files"]]
    assert predict_inputs.stored_names(files, spec) == ["img0.png", "img1.png", "img2.png"]
    assert main([str(flat), str(tmp_path / "out")]) == 1, "never overwrite an earlier conversion"


def _classic_records(path: Path, count: int, size: int, seed: int = 0) -> None:
    """The classic recipe, written here with a plain TFRecordWriter: `label` + `img_raw` only."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            label = int(rng.integers(0, 2))
            pixels = np.zeros((size, size, 3), np.uint8)
            pixels[..., 0 if label == 0 else 2] = 200  # cats red, dogs blue
            pixels = np.clip(pixels + rng.normal(0, 30, pixels.shape), 0, 255).astype(np.uint8)
            feature = {
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                "img_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels.tobytes()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _cats_dogs(train, val, test, *extra):
    return [
        "dataset=cats_dogs",
        f"dataset.train_files=[{train}]",
        f"dataset.val_files=[{val}]",
        f"dataset.test_files=[{test}]",
        "debug=smoke",
        "trainer.batch_size=8",
        *extra,
    ]


def _classic_dataset(folder: Path, *extra: str) -> list[str]:
    """Two classic 40x40 training files of 12 records and one of 8 for val and test; the overrides to use them."""
    for index in range(2):
        _classic_records(folder / f"trpetdata.tfrecords_00{index}", 12, 40, seed=index)
    _classic_records(folder / "val.tfrecords", 8, 40, seed=5)
    val = f"{folder}/val.tfrecords"
    return _cats_dogs(
        f"{folder}/trpetdata.tfrecords_*", val, val, "dataset.stored_size=40", "dataset.image_size=32", *extra
    )


@pytest.mark.integration
def test_classic_files_train_without_conversion(tmp_path):
    overrides = [*[o for o in _classic_dataset(tmp_path) if o != "debug=smoke"], *TINY_MODEL, "trainer.epochs=1"]
    objective = run_task(compose(overrides, tmp_path / "run"))
    metrics = check_run_metrics(tmp_path / "run")
    assert metrics["num_examples"] == {"train": 24, "val": 8, "test": 8}
    assert objective == metrics["objective"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, message",
    [
        ("glob", "matches no file"),
        ("missing_key", "has no 'img_raw' feature"),
        ("wrong_length", "holds 300 bytes, expected 40x40x3 = 4800"),
        ("corrupted", "corrupted or truncated TFRecord file"),
        ("unlabeled", "records have no 'label' feature"),
    ],
)
def test_reader_errors_name_the_file(tmp_path, case, message):
    good = tmp_path / "good.tfrecords"
    _classic_records(good, 6, 40)
    bad = tmp_path / "bad.tfrecords"
    if case == "missing_key":
        with tf.io.TFRecordWriter(str(bad)) as writer:
            feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    elif case == "wrong_length":
        spec = tfrecords.RecordSpec.for_format("raw", 10)
        with tf.io.TFRecordWriter(str(bad)) as writer:
            writer.write(tfrecords.make_example(spec, bytes(300), 1, None, 10, 10))
    elif case == "corrupted":
        data = bytearray(good.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
    elif case == "unlabeled":
        spec = tfrecords.RecordSpec.for_format("raw", 40)
        with tf.io.TFRecordWriter(str(bad)) as writer:
            writer.write(tfrecords.make_example(spec, bytes(4800), None, "a.png", 40, 40))
    train = f"{tmp_path}/nothing_*" if case == "glob" else str(bad)
    overrides = _cats_dogs(train, good, good, "dataset.stored_size=40", "dataset.image_size=32")
    with pytest.raises(DataError, match=message) as error:
        run_task(compose(overrides, tmp_path / "run"))
    assert ("nothing_" if case == "glob" else "bad.tfrecords") in str(error.value)


@pytest.mark.integration
def test_the_training_reader_keeps_each_image_beside_its_label(tmp_path):
    """TFRecordDataset over the shards in a seeded order, batched, parse_example + decode_raw on whole batches."""
    size, count, batch = 16, 24, 4
    spec = tfrecords.RecordSpec.for_format("raw", size)
    files = [str(tmp_path / f"big-{shard}.tfrecords") for shard in range(3)]
    for shard, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as writer:
            for index in range(shard, count, 3):
                pixels = np.full((size, size, 3), (index, 100 * (index % 2), 7), np.uint8)
                writer.write(tfrecords.make_example(spec, pixels.tobytes(), index % 2, None, size, size))

    source, decoder = tfrecord_parts(files, spec)
    batches = pipeline.train_dataset(source, decoder, Preprocess(size), batch, seed=5, shuffle_buffer=10)
    assert next(iter(batches))[0].dtype == tf.uint8
    seen = []
    for images, labels in batches.take(2 * count // batch):
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            index = int(image[0, 0, 0])
            assert (image == image[0, 0]).all(), "a whole image, not parts of two"
            assert label == index % 2 == image[0, 0, 1] // 100, "each image keeps its own record's label"
            seen.append(index)
    assert sorted(seen[:count]) == sorted(seen[count:]) == list(range(count)), "each epoch reads every record once"
    assert seen[:count] != sorted(seen[:count]), "shuffled"

    images, labels = _read_all(files, spec)
    assert [int(image[0, 0, 0]) for image in images] == [i for shard in range(3) for i in range(shard, count, 3)]
    assert labels.tolist() == [int(image[0, 0, 0]) % 2 for image in images]


@pytest.mark.slow  # 35 s: the suite keeps under 10 minutes; run with -m slow
@pytest.mark.integration
def test_training_on_separable_cats_and_dogs_reaches_high_accuracy(tmp_path):
    """Cats are reddish, dogs bluish: a label drifting from its image anywhere on the path shows as ~50%."""
    rng = np.random.default_rng(1)
    for label, name in enumerate(("Cat", "Dog")):
        (tmp_path / "in" / name).mkdir(parents=True)
        for index in range(80):
            pixels = rng.normal(110, 40, (36, 36, 3))
            pixels[..., 0 if label == 0 else 2] += 60
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(tmp_path / "in" / name / f"{index}.png")
    convert(
        tmp_path / "in",
        tmp_path / "records",
        ConvertOptions(image_size=SIZE, format="jpeg", val_fraction=0.2, test_fraction=0.1, records_per_shard=32),
    )
    overrides = [
        "dataset=cats_dogs",
        f"dataset.data_dir={tmp_path / 'records'}",
        "dataset.format=jpeg",
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        *TINY_MODEL,  # the three-layer test model learns colours as surely as VGG19, in a fraction of the time
        "trainer.batch_size=16",
        "trainer.steps_per_epoch=null",
        "trainer.epochs=10",
        "optimizer=adam",
        "optimizer.lr=0.002",
        "model.dropout=0.0",
        "model.weight_decay=0",
    ]
    objective = run_task(compose(overrides, tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert objective >= 0.9, metrics
    assert metrics["test_accuracy"] >= 0.85, metrics


@pytest.mark.e2e
@pytest.mark.slow  # 14 s; mirrored training stays in the default suite (tests/test_distribute.py)
def test_raw_records_train_under_mirrored_and_the_process_exits(tmp_path):
    """Under MirroredStrategy one pipeline feeds both replicas, and `run.py` exits (the test model: the point is the
    process and its console)."""
    overrides = [item for item in _classic_dataset(tmp_path, "strategy=mirrored", "strategy.cpu_devices=2")]
    tiny = ["model=custom", "model._target_=tiny_model.build", "trainer.epochs=1", "trainer.steps_per_epoch=2"]
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            *[o for o in overrides if o != "debug=smoke"],
            *tiny,
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["num_examples"]["train"] == 24
    # TensorFlow's INFO lines of the mirrored strategy stay out of the log and the console.
    assert "then broadcast" not in (tmp_path / "run" / "run.log").read_text() + result.stdout + result.stderr


@pytest.mark.integration
def test_a_record_corrupted_after_conversion_stops_training_with_its_name(tmp_path):
    """With the converter's manifest the records are not counted (nor checked) at start-up; the reader
    checks each record's checksum as it reads it, and the files are then read again to name the bad one."""
    make_pets(tmp_path / "in", per_class=12)
    options = ConvertOptions(image_size=SIZE, format="raw", val_fraction=0.2, test_fraction=0.2, records_per_shard=8)
    convert(tmp_path / "in", tmp_path / "records", options)
    shard = sorted((tmp_path / "records").glob("train*"))[0]
    data = bytearray(shard.read_bytes())
    offset = 0
    for _ in range(3):  # walk the headers (length, its CRC, payload, its CRC) to record 3
        offset += 12 + int.from_bytes(data[offset : offset + 8], "little") + 4
    data[offset + 12 + 100] ^= 0xFF  # a pixel of record 3
    shard.write_bytes(bytes(data))
    overrides = ["dataset=cats_dogs", f"dataset.data_dir={tmp_path / 'records'}", f"dataset.stored_size={SIZE}"]
    overrides += [f"dataset.image_size={SIZE}", "debug=smoke", "trainer.batch_size=4"]
    with pytest.raises(DataError, match=f"{shard.name}: corrupted or truncated TFRecord file at record 3"):
        run_task(compose(overrides, tmp_path / "run"))


@pytest.mark.integration
@pytest.mark.parametrize("format", [pytest.param("raw", marks=pytest.mark.slow), "jpeg"])
def test_a_converted_folder_is_read_with_its_manifests_size_format_and_resize_mode(tmp_path, format):
    """`convert F OUT --image-size 32 [--format jpeg] --resize crop`, then `dataset=cats_dogs dataset.data_dir=OUT`:
    nothing repeated by hand, and the resize mode reaches the model; a contradicting key is one line naming both."""
    from trainer.config.store import to_settings
    from trainer.tasks.data import load_data

    make_pets(tmp_path / "in", per_class=6)
    options = ConvertOptions(image_size=SIZE, format=format, resize="crop", val_fraction=0.25, test_fraction=0.25)
    convert(tmp_path / "in", tmp_path / "records", options)
    base = ["dataset=cats_dogs", f"dataset.data_dir={tmp_path / 'records'}", "dataset.image_size=32", "debug=smoke"]
    data = load_data(to_settings(compose(base)).dataset, 4, 0)
    assert data.num_examples == {"train": 4, "val": 4, "test": 4} and data.resize_mode == "crop"  # round(1.5) = 2
    assert next(iter(data.split("val")))[0].shape[1:] == (32, 32, 3)
    contradictions = {
        "dataset.stored_size=224": r"dataset.stored_size=224 contradicts .*manifest.json, .* stored_size=32",
        f"dataset.format={'jpeg' if format == 'raw' else 'raw'}": rf"dataset.format=.* contradicts .* format={format}",
        "dataset.resize_mode=pad": r"dataset.resize_mode=pad contradicts .* resize_mode=crop",
    }
    for override, message in contradictions.items():
        with pytest.raises(DataError, match=message):
            load_data(to_settings(compose([*base, override])).dataset, 4, 0)
    manifest = json.loads((tmp_path / "records" / "manifest.json").read_text())
    manifest["decode"] = "another decode"
    (tmp_path / "records" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="manifest.json: its images were decoded as 'another decode'"):
        load_data(to_settings(compose(base)).dataset, 4, 0)


@pytest.mark.integration
def test_a_converted_folder_of_three_classes_and_an_unlabeled_one_need_no_class_keys(tmp_path):
    """The docs say a converted folder 'needs nothing more', but a 3-class one needed dataset.num_classes=3 and
    dataset.class_names=[...] (the defaults are cats and dogs), and predicting on an unlabeled converted folder
    needed the model's classes repeated; the manifest and the checkpoint hold them."""
    from tiny_model import build

    from conftest import csv_rows
    from trainer.config.store import to_settings
    from trainer.models.preprocessing import build_models
    from trainer.runs import checkpoints
    from trainer.tasks.data import load_data

    make_pets(tmp_path / "in", per_class=4)
    (tmp_path / "in" / "Fox").mkdir()
    for index in range(4):
        Image.fromarray(np.full((24, 30, 3), (30, 200, 30), np.uint8)).save(tmp_path / "in" / "Fox" / f"{index}.png")
    options = ConvertOptions(SIZE, val_fraction=0.25, test_fraction=0.25, workers=1)
    convert(tmp_path / "in", tmp_path / "records", options)
    base = ["dataset=cats_dogs", f"dataset.data_dir={tmp_path / 'records'}", f"dataset.image_size={SIZE}"]
    data = load_data(to_settings(compose([*base, "debug=smoke"])).dataset, 4, 0)
    assert data.class_names == ["Cat", "Dog", "Fox"] and data.class_counts["val"] == {"Cat": 1, "Dog": 1, "Fox": 1}
    labels = sorted(int(label) for _, batch in data.split("val") for label in batch.numpy())
    assert labels == [0, 1, 2], "the third class's label comes through"
    with pytest.raises(DataError, match=r"manifest.json: lists 3 classes but dataset.num_classes=2; leave it unset"):
        load_data(to_settings(compose([*base, "dataset.num_classes=2"])).dataset, 4, 0)
    # An unlabeled converted folder, predicted by a 3-class model: the classes are the checkpoint's.
    checkpoint = tmp_path / "model.keras"
    model = build_models(build(3, (SIZE, SIZE, 3))).inference
    checkpoints.save(model, checkpoint, checkpoints.ModelInfo(("Cat", "Dog", "Fox"), SIZE, SIZE, "standardize"))
    convert(tmp_path / "in" / "Fox", tmp_path / "flat", ConvertOptions(image_size=SIZE, workers=1))
    output = tmp_path / "predictions.csv"
    overrides = ["dataset=cats_dogs", f"dataset.data_dir={tmp_path / 'flat'}", "mode=predict",
                 f"checkpoint={checkpoint}", f"predict.input={tmp_path / 'flat'}/test.tfrecords_*",
                 f"predict.output={output}"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "predict"))
    rows = csv_rows(output)
    assert sorted(row["id"] for row in rows) == [f"{index}.png" for index in range(4)]
    assert all(row["predicted_class"] in ("Cat", "Dog", "Fox") and not row["error"] for row in rows)


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["resize", "crop", "pad"])
def test_jpeg_records_without_a_manifest_train_on_the_pixels_serve_bytes_gets(tmp_path, mode):
    """JPEG records of 48x32 photos and no converter manifest: training squashed them whatever
    dataset.resize_mode said, while serve_bytes cropped or padded them (a train/serve skew)."""
    from trainer.data.decode import decode_images
    from trainer.data.tfrecords import RecordSpec, make_example

    spec = RecordSpec.for_format("jpeg", 32)
    rng = np.random.default_rng(0)
    encoded = []
    with tf.io.TFRecordWriter(str(tmp_path / "pets.tfrecords")) as writer:
        for index in range(8):
            pixels = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
            pixels[:, :8] = 255  # a bright left edge: squashed, cropped and padded give other pixels
            encoded.append(tf.io.encode_jpeg(pixels, quality=95).numpy())
            writer.write(make_example(spec, encoded[-1], index % 2, None, 32, 48))
    records = f"{tmp_path}/pets.tfrecords"
    overrides = _cats_dogs(records, records, records, "dataset.format=jpeg", "dataset.stored_size=32",
                           "dataset.image_size=32", f"dataset.resize_mode={mode}")  # fmt: skip
    data = load_data(to_settings(compose(overrides)).dataset, 8, 0)
    trained = np.concatenate([images.numpy() for images, _ in data.split("test")])
    served = decode_images(tf.constant(encoded), 32, mode, name="image_bytes").numpy()  # serve_bytes' decode
    np.testing.assert_array_equal(trained, served)
