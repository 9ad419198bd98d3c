"""TFRecord input: any TensorFlow file system (ram://), compression, bad records, per-worker shares."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_cats_dogs import SIZE, make_pets

from conftest import compose, csv_rows, launch_workers, tfrecord_parts
from trainer.data import pipeline, predict_inputs, record_writer, shares, tfrecords
from trainer.data.decoders import TFRecordDecoder
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.data.preprocess import Preprocess
from trainer.data.shares import Records
from trainer.errors import DataError, one_line
from trainer.tasks import run_task


def _copy_tree(source: Path, target: str) -> None:
    tf.io.gfile.makedirs(target)
    for path in source.iterdir():
        tf.io.gfile.copy(str(path), f"{target}/{path.name}", overwrite=True)


def _train_overrides(data_dir: str, *extra: str) -> list[str]:
    return [
        "dataset=cats_dogs",
        f"dataset.data_dir={data_dir}",
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        "debug=smoke",
        "trainer.batch_size=4",
        *extra,
    ]


def _converted(tmp_path: Path, compression: str = "none") -> Path:
    make_pets(tmp_path / "in", per_class=10)
    options = ConvertOptions(
        image_size=SIZE, val_fraction=0.2, test_fraction=0.2, records_per_shard=4, workers=1, compression=compression
    )
    convert(tmp_path / "in", tmp_path / "records", options)
    return tmp_path / "records"


def _predict(tmp_path: Path, data_dir: str, checkpoint: Path, pattern: str, *extra: str) -> list[dict]:
    output = tmp_path / "predictions.csv"
    overrides = _train_overrides(data_dir, "mode=predict", f"checkpoint={checkpoint}")
    overrides += [f"predict.input={pattern}", f"predict.output={output}", *extra]
    run_task(compose(overrides, tmp_path / "predict"))
    return csv_rows(output)


@pytest.mark.integration
@pytest.mark.slow
def test_ram_filesystem_shards_train_evaluate_and_predict(tmp_path):
    """ram:// lives in this process, as gs:// would be seen: every path goes through tf.io.gfile."""
    _copy_tree(_converted(tmp_path), "ram://pets")
    run_task(compose(_train_overrides("ram://pets"), tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_examples"] == {"train": 12, "val": 4, "test": 4}, "counts from the manifest on ram://"
    best = tmp_path / "run" / "checkpoints" / "best.keras"
    overrides = _train_overrides("ram://pets", "mode=evaluate", f"checkpoint={best}")
    accuracy = run_task(compose(overrides, tmp_path / "evaluate"))
    assert accuracy == pytest.approx(metrics["test_accuracy"]), "the same checkpoint on the same test shards"
    rows = _predict(tmp_path, "ram://pets", best, "ram://pets/test.tfrecords_*")
    assert len(rows) == 4
    # The class names are the manifest's (the converter's folder names), which the model carries.
    assert {row["true_class"] for row in rows} | {row["predicted_class"] for row in rows} <= {"Cat", "Dog"}
    hits = sum(row["true_class"] == row["predicted_class"] for row in rows)
    assert hits / 4 == pytest.approx(accuracy), "the CSV's predictions score what evaluation measured"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_records_train_and_predict(tmp_path, compression):
    records = _converted(tmp_path, compression)
    run_task(compose(_train_overrides(str(records)), tmp_path / "run"))  # dataset.compression=auto
    best = tmp_path / "run" / "checkpoints" / "best.keras"
    setting = f"dataset.compression={compression}"
    rows = _predict(tmp_path, str(records), best, f"{records}/test.tfrecords_*", setting)
    assert len(rows) == 4 and all(row["error"] == "" for row in rows)


@pytest.mark.integration
@pytest.mark.parametrize("compression, setting", [("gzip", "none"), ("zlib", "gzip"), ("none", "zlib")])
def test_a_compression_mismatch_names_the_file_and_the_setting(tmp_path, compression, setting):
    records = _converted(tmp_path, compression)
    overrides = _train_overrides(str(records), f"dataset.compression={setting}")
    with pytest.raises(DataError, match=f"dataset.compression={setting}; set dataset.compression={compression}"):
        run_task(compose(overrides, tmp_path / "run"))


@pytest.mark.unit
def test_detect_compression_from_the_first_bytes(tmp_path):
    for compression in ("none", "gzip", "zlib"):
        path = str(tmp_path / f"a.{compression}")
        with record_writer.RecordFile(path, compression) as shard:
            for length in (120, 0x9C78, 5):  # a first length whose low bytes look like a ZLIB header
                shard.write(bytes(length))
        assert tfrecords.detect_compression(path) == compression
    (tmp_path / "junk").write_bytes(b"hello, this is not a record file")
    assert tfrecords.detect_compression(str(tmp_path / "junk")) is None


def _write(path: Path, records: list[bytes]) -> None:
    with record_writer.RecordFile(str(path)) as shard:
        for record in records:
            shard.write(record)


def _example(label=None, image=None, filename=None, raw_filename: bytes | None = None) -> bytes:
    features = {"img_raw": record_writer.bytes_feature(bytes(SIZE * SIZE * 3) if image is None else image)}
    if label is not None:
        features["label"] = record_writer.int64_feature(label)
    if filename is not None:
        features["filename"] = filename
    return record_writer.encode_example(features)


OVERLONG_VARINT = b"\x0a" + b"\xff" * 11 + b"\x01"  # field 1's length: a varint of 12 bytes


BAD_RECORDS = [
    # case, the records of bad.tfrecords, mode, the one line expected
    ("label_inspect", [_example(1), _example(5)], "inspect", r"record 1 has label 5, expected 0 to 1"),
    ("varint_first", [OVERLONG_VARINT], "train", r"record 0 is not a tf.train.Example"),
    ("varint_later", [_example(0), OVERLONG_VARINT], "train", r"record 1 is not a tf.train.Example"),
    ("not_example", [b"not an example at all"], "train", r"record 0 is not a tf.train.Example"),
    (
        "empty_image",
        [_example(0, image=b"")],
        "train",
        r"record 0 cannot be decoded: 'img_raw' must hold one non-empty",
    ),
    ("folder", [], "train", r"matches the folder .*bad.tfrecords"),
]


@pytest.mark.integration
@pytest.mark.parametrize("case, records, mode, message", BAD_RECORDS, ids=[case[0] for case in BAD_RECORDS])
def test_bad_records_give_one_line_naming_the_file(tmp_path, case, records, mode, message):
    good = tmp_path / "good.tfrecords"
    _write(good, [_example(index % 2) for index in range(4)])
    bad = tmp_path / "bad.tfrecords"
    if case == "folder":
        bad.mkdir()
    else:
        _write(bad, records)
    if case == "bad_crc":
        data = bytearray(bad.read_bytes())
        data[-20] ^= 0xFF  # inside record 1's image
        bad.write_bytes(bytes(data))
    overrides = [
        "dataset=cats_dogs",
        f"dataset.train_files=[{tmp_path}/*.tfrecords]" if mode == "train" else f"dataset.train_files=[{good}]",
        f"dataset.val_files=[{bad if mode == 'inspect' else good}]",
        f"dataset.test_files=[{good}]",
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        "debug=smoke",
        "trainer.batch_size=2",
        f"mode={mode}",
    ]
    if mode == "inspect":
        overrides += ["inspect.split=val"]
    if mode == "predict":
        overrides += [f"predict.input={bad}", f"predict.output={tmp_path / 'p.csv'}"]
        overrides += [f"checkpoint={_tiny_checkpoint(tmp_path)}"]
    with pytest.raises(DataError, match=message) as error:
        run_task(compose(overrides, tmp_path / "run"))
    text = str(error.value)
    assert "\n" not in text and "bad.tfrecords" in text, text


NOT_EXAMPLE = "is not a tf.train.Example with bytes 'img_raw' and int64 'label'"


def _pixels(value: int) -> bytes:
    return bytes(np.arange(SIZE * SIZE * 3, dtype=np.uint8) * value % 251)


@pytest.mark.integration
def test_predict_gives_every_bad_record_its_row_and_predicts_the_rest(tmp_path):
    name = record_writer.bytes_feature
    first = [  # record: why it cannot be used, or None
        (b"not an example either", f"record 0 {NOT_EXAMPLE}"),  # record 0 by the rule of record 6
        (_example(0, _pixels(1), name(b"a.png")), None),
        (_example(1, _pixels(2), record_writer.int64_feature(17)), None),  # a file name stored as int64
        (_example(5, _pixels(3)), "record 3 has label 5, expected 0 to 1 (the model's classes)"),
        (
            _example(0, bytes(7)),
            "record 4 cannot be decoded: 'img_raw' holds 7 bytes, expected 32x32x3 = 3072 (dataset.stored_size)",
        ),
        (_example(1, b""), "record 5 cannot be decoded: 'img_raw' must hold one non-empty byte string"),
        (b"not an example at all", f"record 6 {NOT_EXAMPLE}"),
        (_example(1, _pixels(4), name(b"f.png")), None),
    ]
    second = [(_example(0, _pixels(5)), None), (_example(1, _pixels(6)), None), (_example(0, _pixels(7)), None)]
    a, b, clean = tmp_path / "a.tfrecords", tmp_path / "b.tfrecords", tmp_path / "clean.tfrecords"
    _write(a, [record for record, _ in first])
    _write(b, [record for record, _ in second])
    data = bytearray(b.read_bytes())
    data[-20] ^= 0xFF  # inside the last record's image: its checksum fails
    b.write_bytes(bytes(data))
    good = [record for record, reason in first + second[:2] if reason is None]  # second[2] is the spoilt one
    _write(clean, good)
    checkpoint = _tiny_checkpoint(tmp_path)
    with pytest.raises(DataError, match=re.escape(f"predict.input: {b}: record 2 is corrupted or truncated")):
        _predict(tmp_path, str(tmp_path), checkpoint, f"'{tmp_path}/[ab].tfrecords'")  # quoted for Hydra
    rows = csv_rows(tmp_path / "predictions.csv")  # written whole: every row that could be read
    assert [row["id"] for row in rows] == ["0", "a.png", "17", "3", "4", "5", "6", "f.png", "8", "9", "10"]
    assert [row["file"] for row in rows] == ["a.tfrecords"] * 8 + ["b.tfrecords"] * 3, "the record file of each row"
    expected = [f"{a}: {reason}" if reason else "" for _, reason in first] + ["", ""]
    assert [row["error"] for row in rows[:10]] == expected
    assert rows[10]["error"].startswith(f"{b}: record 2 is corrupted or truncated: the rest of the file cannot be read")
    assert not [row["error"] for row in rows if "function_node" in row["error"] or "[Op:" in row["error"]]
    # The records that could be read are predicted as the same records in a clean file are.
    (tmp_path / "clean").mkdir()
    reference = _predict(tmp_path / "clean", str(tmp_path), checkpoint, str(clean))
    predicted = [row for row in rows if not row["error"]]
    assert [row["true_class"] for row in predicted] == [row["true_class"] for row in reference]
    probabilities = [
        [[float(row[f"prob_{name}"]) for name in ("cat", "dog")] for row in table] for table in (predicted, reference)
    ]
    np.testing.assert_allclose(*probabilities, rtol=1e-6)


@pytest.mark.integration
def test_predict_gives_a_jpeg_that_does_not_decode_its_row(tmp_path):
    from PIL import Image

    def jpeg(value: int) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(np.full((SIZE, SIZE, 3), value, np.uint8)).save(buffer, format="JPEG")
        return buffer.getvalue()

    spec = tfrecords.RecordSpec.for_format("jpeg", SIZE)
    records = [(jpeg(40), None), (b"\xff\xd8\xff\xe0 not really a jpeg", "cannot be decoded"), (jpeg(200), None)]
    path = tmp_path / "images.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index, (data, _) in enumerate(records):
            writer.write(tfrecords.make_example(spec, data, index % 2, f"{index}.jpg", SIZE, SIZE))
    chunks = list(predict_inputs.tfrecord_chunks([path], spec, Preprocess(SIZE), 2, 4, "resize"))
    items, images = chunks[0]
    assert [item.id for item in items] == ["0.jpg", "1.jpg", "2.jpg"] and [item.label for item in items] == [0, 1, 0]
    assert (
        items[1].error.startswith(f"{path}: record 1 cannot be decoded: ") and items[0].error is items[2].error is None
    )
    assert images.shape == (2, SIZE, SIZE, 3)
    np.testing.assert_allclose(images.numpy()[:, 16, 16, 0], [40, 200], atol=2)


@pytest.mark.integration
@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_an_empty_shard_among_good_ones_reads_as_no_records_with_a_warning(tmp_path, compression, caplog):
    def write(path: Path, records: list[bytes]) -> None:
        with tf.io.TFRecordWriter(str(path), options=compression or None) as writer:
            for record in records:
                writer.write(record)

    good, empty = tmp_path / "good.tfrecords", tmp_path / "empty.tfrecords"
    write(good, [_example(index % 2) for index in range(4)])
    write(empty, [])  # 0 bytes uncompressed; a GZIP file with no records (Beam and Spark write such shards)
    overrides = [
        "dataset=cats_dogs",
        f"dataset.train_files=[{good},{empty}]",
        f"dataset.val_files=[{good}]",
        f"dataset.test_files=[{good}]",
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        "mode=inspect",
        "inspect.num_images=4",
    ]
    with caplog.at_level("WARNING"):
        run_task(compose(overrides, tmp_path / "run"))
    assert f"{empty} holds no records: read as none <dataset.train_files>" in caplog.text
    with pytest.raises(DataError, match=r"dataset.train_files: every file holds no records \("):
        run_task(compose([*overrides, f"dataset.train_files=[{empty}]"], tmp_path / "run2"))


def _spoil_record(path: Path, index: int) -> None:
    """Flips a byte inside the data of record `index` (its checksum then fails)."""
    data, offset = bytearray(path.read_bytes()), 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    data[offset + 12 + int.from_bytes(data[offset : offset + 8], "little") // 2] ^= 0xFF
    path.write_bytes(bytes(data))


AFTER_START_UP = [
    # case, mode, the file spoiled, the one line expected: with a manifest, no file is read whole at start-up
    pytest.param(  # the same check as corrupt_evaluate, in training (16 s)
        "corrupt_train",
        "train",
        "train.tfrecords_001",
        r"train.tfrecords_001: corrupted or truncated TFRecord file at record 2",
        marks=pytest.mark.slow,
    ),
    (
        "corrupt_evaluate",
        "evaluate",
        "test.tfrecords_000",
        r"test.tfrecords_000: corrupted or truncated TFRecord file at record 1",
    ),
    ("label_train", "train", "train.tfrecords_002", r"train.tfrecords_002: record 3 has label 5, expected 0 to 1"),
    ("label_inspect", "inspect", "val.tfrecords_000", r"val.tfrecords_000: record 1 has label 5, expected 0 to 1"),
]


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, mode, name, message", AFTER_START_UP, ids=[getattr(case, "values", case)[0] for case in AFTER_START_UP]
)
def test_bad_records_behind_a_manifest_give_one_line_naming_the_file_and_record(tmp_path, case, mode, name, message):
    records = _converted(tmp_path)
    assert (records / "manifest.json").exists()
    if case.startswith("label"):
        bad_index = int(re.search(r"record (\d+)", message).group(1))
        _write(records / name, [_example(5 if index == bad_index else index % 2) for index in range(4)])
    else:
        _spoil_record(records / name, int(re.search(r"record (\d+)", message).group(1)))
    overrides = _train_overrides(str(records), f"mode={mode}")
    if mode == "evaluate":
        classes = json.loads((records / "manifest.json").read_text())["class_names"]
        overrides += [f"checkpoint={_tiny_checkpoint(tmp_path, tuple(classes))}"]
    if mode == "inspect":
        overrides += ["inspect.split=val", "inspect.num_images=4"]
    with pytest.raises(DataError, match=message) as error:
        run_task(compose(overrides, tmp_path / "run"))
    assert "\n" not in str(error.value)


def _tiny_checkpoint(folder: Path, class_names: tuple[str, ...] = ("cat", "dog")) -> Path:
    """A checkpoint as training saves it: uint8 input, its preprocessing and its class names inside."""
    from trainer.models.preprocessing import build_models
    from trainer.models.vgg19 import build_vgg19
    from trainer.runs import checkpoints

    path = folder / "tiny.keras"
    model = build_models(build_vgg19(2, (SIZE, SIZE, 3), width_multiplier=0.125, fc_units=16, dropout=0.0)).inference
    checkpoints.save(model, path, checkpoints.ModelInfo(class_names, SIZE, SIZE, "standardize"))
    return path


@pytest.mark.integration
def test_overlapping_globs_are_read_once_and_the_log_says_so(tmp_path, caplog):
    for index in range(3):
        _write(tmp_path / f"train.tfrecords_{index:03d}", [_example(0)])
    patterns = [f"{tmp_path}/train.tfrecords_*", f"{tmp_path}/train.tfrecords_001"]
    with caplog.at_level(logging.WARNING):
        files = tfrecords.expand(patterns, "dataset.train_files")
    assert files == [str(tmp_path / f"train.tfrecords_{index:03d}") for index in range(3)]
    assert "1 file(s) matched by more than one glob are read once" in caplog.text


@pytest.mark.unit
@pytest.mark.parametrize(
    "names, format, kind",
    [
        (["a.tfrec", "b.tfrec"], "auto", "tfrecords"),
        (["a.record"], "auto", "tfrecords"),
        (["train.tfrecords_000"], "auto", "tfrecords"),
        (["shard-0", "shard-1"], "tfrecord", "tfrecords"),
        (["a.bin"], "auto", "records"),
        (["data"], "binary", "records"),
        (["data"], "records", "records"),  # predict.format's old name for binary: read, with a warning
        (["a.jpg", "b.png"], "auto", "images"),
    ],
)
def test_predict_input_kinds(tmp_path, names, format, kind):
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    found, files, _ = predict_inputs.resolve_inputs(f"{tmp_path}/*", format)
    assert found == kind and len(files) == len(names)


@pytest.mark.unit
@pytest.mark.parametrize(
    "names, suggested",
    [
        (["train.tfrecords_000", "test.tfrecords_000", "manifest.json", "data_check.json"], "test.tfrecord*"),
        (["data_batch_1.bin", "test_batch.bin"], "test_batch.bin"),
        (["shard.tfrec"], "*.tfrecord*"),
    ],
)
def test_a_folder_of_record_files_is_one_line_saying_how_to_give_it(tmp_path, names, suggested):
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(DataError, match=rf"a folder of record files, not of images; .*predict.input='{tmp_path}/"):
        predict_inputs.resolve_inputs(str(tmp_path))
    with pytest.raises(DataError) as error:
        predict_inputs.resolve_inputs(f"{tmp_path}/")
    assert str(error.value).endswith(f"predict.input='{tmp_path}/{suggested}'")
    assert predict_inputs.resolve_inputs(str(tmp_path), "images")[0] == "images", "predict.format=images is obeyed"


@pytest.mark.unit
def test_a_folder_named_as_tfrecords_holds_the_records(tmp_path):
    """Spark writes `NAME.tfrecords/part-r-00000` and a `_SUCCESS` marker."""
    folder = tmp_path / "pets.tfrecords"
    folder.mkdir()
    for name in ("part-r-00000", "part-r-00001", "_SUCCESS"):
        (folder / name).write_bytes(b"x")
    kind, files, _ = predict_inputs.resolve_inputs(str(folder))
    assert kind == "tfrecords" and [file.name for file in files] == ["part-r-00000", "part-r-00001"]


def _indexed_shards(folder: Path, counts: list[int]) -> list[str]:
    """Raw records whose first pixel holds their global index (as two bytes)."""
    spec = tfrecords.RecordSpec.for_format("raw", 4)
    files, index = [], 0
    for shard, count in enumerate(counts):
        path = folder / f"part-{shard}.tfrecords"
        with record_writer.RecordFile(str(path)) as handle:
            for _ in range(count):
                pixels = np.zeros((4, 4, 3), np.uint8)
                pixels[0, 0, :2] = (index % 256, index // 256)
                handle.write(tfrecords.make_example(spec, pixels.tobytes(), index % 2, None, 4, 4))
                index += 1
        files.append(str(path))
    return files


def _index(image) -> int:
    return int(image[0, 0, 0]) + 256 * int(image[0, 0, 1])


def _training_reader(records: Records, spec, batch_size: int = 1):
    """The training pipeline over `records` (whole files, ranges, or one worker's share), shuffle buffer 8."""
    source, decoder = tfrecord_parts(records.files, spec, shares=records)
    return pipeline.train_dataset(source, decoder, Preprocess(4), batch_size, 3, 8)


def _indices_read(records: Records, spec) -> list[int]:
    """One epoch of the training reader over every record of `records`: the record indices it yields."""
    whole = Records(records.ranges, records.count)  # a pass is every record, not a worker's per-epoch part
    return [_index(images[0]) for images, _ in _training_reader(whole, spec).take(records.count)]


@pytest.mark.unit
@pytest.mark.parametrize("ranges", [False, True])
def test_iterators_made_before_training_do_not_change_the_records_training_reads(tmp_path, ranges):
    files = _indexed_shards(tmp_path, [10, 9, 11])
    spec = tfrecords.RecordSpec.for_format("raw", 4)
    parts = Records(tuple((path, 1, 8) for path in files), 24) if ranges else Records.whole_files(files, 30)
    dataset = _training_reader(Records(parts.ranges, parts.count, per_epoch=20), spec)

    def indices(count):
        return [_index(images.numpy()[0]) for images, _ in dataset.take(count)]

    first = indices(40)  # two passes
    next(iter(dataset))
    assert indices(40) == first
    assert first[:20] != first[20:], "each pass still gets its own order"


@pytest.mark.unit
@pytest.mark.parametrize(
    "counts, whole_files", [([5, 7, 4, 6, 3], True), ([30], False), ([11, 9], False), ([10, 9], True)]
)
def test_two_workers_each_read_about_half_and_together_every_record_once(tmp_path, counts, whole_files):
    """Whole files when there are at least as many files as workers and their shares are within one step
    of each other, else record ranges."""
    files = _indexed_shards(tmp_path, counts)
    spec = tfrecords.RecordSpec.for_format("raw", 4)
    total = sum(counts)
    seen = []
    plan = shares.plan(files, counts, 2, 1)
    assert plan.whole_files == whole_files
    for worker in plan.workers:
        read = _indices_read(worker, spec)
        assert 0.3 * total <= len(read) <= 0.7 * total, (len(read), total)
        seen += read
    assert sorted(seen) == list(range(total)), "every record once over both workers"


@pytest.mark.e2e
@pytest.mark.slow
def test_two_loopback_workers_train_on_their_own_shares(tmp_path):
    """Two multi_worker processes on 127.0.0.1: each logs its share and both finish with the same weights."""
    records = _converted(tmp_path)
    arguments = [*_train_overrides(str(records)), "strategy=multi_worker", "trainer.steps_per_epoch=2"]
    arguments += ["model.batch_norm=false"]  # Keras's batch norm statistics are each worker's own
    processes = launch_workers(
        arguments, tmp_path, per_worker=lambda index: ([f"hydra.run.dir={tmp_path / f'run{index}'}"], {})
    )
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for index, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, output[-3000:]
        assert f"Input pipeline {index + 1} of 2 reads" in output, output[-3000:]
    weights = [line for output in outputs for line in output.splitlines() if "Final weights sha256" in line]
    assert len(weights) == 2 and weights[0].split("sha256")[-1] == weights[1].split("sha256")[-1]


@pytest.mark.integration
def test_unequal_converter_shards_are_shared_by_record_ranges_from_the_manifest_counts(tmp_path, monkeypatch, caplog):
    """The converter's shards of 5, 5 and 2 train records over 2 workers: whole files would give one worker 7
    records and the other 5, so each gets 6 in record ranges, counted from the manifest without reading a file."""
    from trainer.config import to_settings
    from trainer.tasks.data import load_data

    make_pets(tmp_path / "in", per_class=10)
    options = ConvertOptions(image_size=SIZE, val_fraction=0.2, test_fraction=0.2, records_per_shard=5, workers=1)
    manifest = convert(tmp_path / "in", tmp_path / "records", options)
    assert manifest["splits"]["train"]["file_counts"] == [5, 5, 2]

    def no_counting(*args, **kwargs):
        raise AssertionError("the manifest lists every file's count")

    monkeypatch.setattr(tfrecords, "scan_records", no_counting)
    settings = to_settings(compose(_train_overrides(str(tmp_path / "records"))))
    data = load_data(settings.dataset, 2, 0, num_workers=2)
    assert data.train_steps == 6  # 6 records per worker, 1 per step
    with caplog.at_level(logging.INFO):
        for index in range(2):
            data.train(0, tf.distribute.InputContext(2, index, 2))
    lines = [record.getMessage() for record in caplog.records if "Input pipeline" in record.getMessage()]
    assert "records 0-4 of" in lines[0] and "0-0 of" in lines[0] and "(6 records, 6 per epoch)" in lines[0], lines
    assert "records 1-4 of" in lines[1] and "0-1 of" in lines[1] and "(6 records, 6 per epoch)" in lines[1], lines


@pytest.mark.unit
@pytest.mark.parametrize("counts, records_per_step, whole_files", [([7, 5], 1, False), ([7, 5], 2, True)])
def test_each_worker_reads_its_steps_per_epoch_and_no_record_twice_in_an_epoch(
    tmp_path, counts, records_per_step, whole_files
):
    files = _indexed_shards(tmp_path, counts)
    spec = tfrecords.RecordSpec.for_format("raw", 4)
    plan = shares.plan(files, counts, 2, records_per_step)
    assert plan.whole_files == whole_files
    steps = plan.steps_per_epoch
    for worker in plan.workers:
        reader = _training_reader(worker, spec, records_per_step)
        batches = [images.numpy() for images, _ in reader.take(10 * steps)]
        for epoch in range(10):
            read = [
                int(image[0, 0, 0]) + 256 * int(image[0, 0, 1])
                for batch in batches[epoch * steps : (epoch + 1) * steps]
                for image in batch
            ]
            assert len(read) == len(set(read)) == worker.per_epoch == steps * records_per_step


@pytest.mark.integration
def test_a_bad_record_in_the_middle_of_a_file_is_named_by_the_pipeline_in_predict_and_in_the_start_up_scan(tmp_path):
    """Each record travels with its file and number through tf.data, and the decoder gives its reason: predict
    writes it in that row and predicts the rest; the scan names the same file:record. Nothing is read again."""
    path = tmp_path / "mid.tfrecords"
    _write(path, [_example(index % 2, _pixels(index + 1)) for index in range(5)] + [_example(0, bytes(9))]
           + [_example(index % 2, _pixels(index + 1)) for index in range(6, 10)])  # fmt: skip
    spec = tfrecords.RecordSpec.for_format("raw", SIZE)
    items = [item for chunk, _ in predict_inputs.tfrecord_chunks([path], spec, Preprocess(SIZE), 2, 4, "resize")
             for item in chunk]  # fmt: skip
    reason = "record 5 cannot be decoded: 'img_raw' holds 9 bytes, expected 32x32x3 = 3072 (dataset.stored_size)"
    assert [item.error for item in items] == [None] * 5 + [f"{path}: {reason}"] + [None] * 4
    assert [item.label for item in items] == [0, 1, 0, 1, 0, 0, 0, 1, 0, 1]
    with pytest.raises(DataError, match=re.escape(f"{path}: {reason}")):
        tfrecords.refuse_first(str(path), spec, lambda records: TFRecordDecoder(spec, 2).checked(records)[2])
    _write(path, [_example(index % 2) for index in range(3)] + [_example(7)] + [_example(1)])
    with pytest.raises(DataError, match=re.escape(f"{path}: record 3 has label 7, expected 0 to 1")):
        tfrecords.scan_records(str(path), spec, 2)


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["resize", "crop", "pad"])
def test_predict_on_jpeg_records_makes_them_square_as_training_and_serve_bytes_do(tmp_path, mode):
    from PIL import Image

    from trainer.data.decode import decode_images

    buffer = io.BytesIO()
    wide = np.zeros((24, 48, 3), np.uint8)
    wide[:, :12], wide[:, 12:36], wide[:, 36:] = 250, 120, 30  # the centre square differs from the whole
    Image.fromarray(wide).save(buffer, format="PNG")
    spec = tfrecords.RecordSpec.for_format("jpeg", 16)
    path = tmp_path / "wide.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tfrecords.make_example(spec, buffer.getvalue(), 0, "wide.png", 24, 48))
    ((items, images),) = predict_inputs.tfrecord_chunks([path], spec, Preprocess(16), 2, 4, mode)
    served = decode_images(tf.constant([buffer.getvalue()]), 16, mode, name="image_bytes")
    trained = TFRecordDecoder(spec, 2, resize_mode=mode)(tf.constant([path.read_bytes()[12:-4]]))[0]
    assert items[0].error is None
    np.testing.assert_array_equal(images.numpy(), served.numpy())
    np.testing.assert_array_equal(trained.numpy(), served.numpy())


@pytest.mark.unit
def test_an_op_errors_line_leaves_tensorflows_function_node_and_op_plumbing(tmp_path):
    path = tmp_path / "bad.tfrecords"
    _write(path, [_example(0), _example(1)])
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # the last record's checksum fails
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.OpError) as error:
        list(tf.data.TFRecordDataset(str(path)))
    assert "{{function_node" in error.value.message, "TensorFlow's raw message has the prefix"
    line = one_line(error.value)
    assert line.startswith("corrupted record at") and "function_node" not in line and "[Op:" not in line, line
