"""The converter: protobuf-exact records without TensorFlow, safe reruns, odd inputs, compression."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_cats_dogs import SIZE, make_pets

from trainer.convert import main
from trainer.data import predict_inputs, record_writer, tfrecords
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.errors import UserError

OPTIONS = ConvertOptions(image_size=SIZE, records_per_shard=5, workers=1)


@pytest.mark.unit
@pytest.mark.parametrize("format", ["raw", "jpeg"])
@pytest.mark.parametrize("label", [None, 0, 7, 2**40, -3])
def test_records_are_the_bytes_of_deterministic_protobuf(format, label):
    keys = record_writer.DEFAULT_KEYS[format]
    name = b"Cat/\xff\xfe.png"
    ours = record_writer.encode_example(
        record_writer.example_features(format, keys, b"\x00\x01" * 40, label, name, 20, 30)
    )
    int64 = lambda value: tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))  # noqa: E731
    data = lambda value: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))  # noqa: E731
    feature = {keys["image"]: data(b"\x00\x01" * 40)}
    if label is not None:
        feature[keys["label"]] = int64(label)
    if format == "jpeg":
        feature.update({"image/height": int64(20), "image/width": int64(30), "image/format": data(b"jpeg")})
    if format == "jpeg" or label is None:
        feature[keys["filename"]] = data(name)
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    assert ours == example.SerializeToString(deterministic=True)


def _shards(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if ".tfrecords_" in name)


@pytest.mark.integration
def test_a_rerun_over_a_killed_conversion_leaves_no_stale_shard(tmp_path):
    make_pets(tmp_path / "big", per_class=20)
    make_pets(tmp_path / "small", per_class=6)
    out = tmp_path / "out"
    convert(tmp_path / "big", out, OPTIONS)
    (out / "manifest.json").unlink()  # killed before the manifest: stale shards stay behind
    (out / ".staging").mkdir()
    (out / ".staging" / "train-00009").write_bytes(b"partial")
    (out / ".train.tfrecords_000.tmp").write_bytes(b"partial")
    manifest = convert(tmp_path / "small", out, OPTIONS)
    assert _shards(out) == sorted(manifest["splits"]["train"]["files"]), "no shard of the first run is left"
    written = [*manifest["splits"]["train"]["files"], "manifest.json", "data_check.json"]
    assert sorted(os.listdir(out)) == sorted(written)
    records = sum(1 for name in _shards(out) for _ in tf.data.TFRecordDataset(str(out / name)))
    assert records == manifest["splits"]["train"]["count"] == 12


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, message",
    [
        ("foreign", r"holds files the converter did not write \(notes.txt\)"),
        ("finished", "already holds a converted dataset"),
        ("inside", "is inside INPUT_DIR"),
    ],
)
def test_output_folders_that_are_refused(tmp_path, case, message):
    make_pets(tmp_path / "in", per_class=3)
    out = tmp_path / "out"
    if case == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "finished":
        convert(tmp_path / "in", out, OPTIONS)
    else:
        out = tmp_path / "in" / "records"
    before = sorted(os.listdir(out)) if out.exists() else None
    with pytest.raises(UserError, match=message):
        convert(tmp_path / "in", out, OPTIONS)
    assert (sorted(os.listdir(out)) if out.exists() else None) == before, "nothing already there is touched"


@pytest.mark.integration
def test_a_class_named_twice_is_one_line_and_folders_left_out_are_named(tmp_path, capsys, caplog):
    make_pets(tmp_path / "in", per_class=3)
    assert main([str(tmp_path / "in"), str(tmp_path / "twice"), "--classes", "Cat,Cat"]) == 1
    assert "--classes Cat,Cat: Cat given twice; name each class once" in capsys.readouterr().err
    assert not (tmp_path / "twice").exists()
    assert main([str(tmp_path / "in"), str(tmp_path / "cats"), "--classes", "Cat"]) == 1
    assert "--classes Cat: one class; a classifier needs two" in capsys.readouterr().err
    shutil.copytree(tmp_path / "in" / "Cat", tmp_path / "in" / "Lynx")
    with caplog.at_level("WARNING"):
        assert main([str(tmp_path / "in"), str(tmp_path / "pets"), "--classes", "Dog,Cat"]) == 0
    assert "--classes Dog,Cat leaves out the folders Lynx of" in caplog.text


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims width x height (the pixels are never there)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 10)))


@pytest.mark.integration
def test_odd_inputs_are_skipped_with_their_reason_or_kept_safely(tmp_path):
    folder = tmp_path / "in"
    make_pets(folder, per_class=3)
    _png_header_only(folder / "Cat" / "bomb.png", 30000, 30000)
    odd_name = os.fsdecode(b"caf\xe9.png")  # Latin-1 bytes: not valid UTF-8
    Image.fromarray(np.full((10, 10, 3), 40, np.uint8)).save(folder / "Dog" / odd_name)
    (folder / "stray.jpg").write_bytes((folder / "Cat" / "0.png").read_bytes())
    (folder / "Dog" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    os.mkfifo(folder / "Cat" / "pipe.jpg")
    manifest = convert(folder, tmp_path / "out", ConvertOptions(image_size=SIZE, workers=2))
    reasons = {entry["file"]: entry["reason"] for entry in manifest["skipped"]}
    assert reasons.pop("Cat/bomb.png").startswith("decompression bomb")
    assert reasons == {
        "stray.jpg": "a top-level file, not in a class folder",
        "Dog/gone.jpg": "broken symlink",
        "Cat/pipe.jpg": "a FIFO",
    }
    assert manifest["splits"]["train"]["count"] == 7, "the oddly named image is converted"
    assert not [name for name in os.listdir(tmp_path / "out") if name.endswith(".tmp") or name.startswith(".")]

    # Unlabeled, the name is stored byte for byte; the reader shows it with a backslash escape.
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.fromarray(np.full((10, 10, 3), 40, np.uint8)).save(flat / odd_name)
    out = tmp_path / "flat_out"
    manifest = convert(flat, out, ConvertOptions(image_size=SIZE, workers=1))
    first = next(iter(tf.data.TFRecordDataset(str(out / manifest["splits"]["test"]["files"][0]))))
    stored = tf.train.Example.FromString(first.numpy()).features.feature["filename"].bytes_list.value[0]
    assert stored == b"caf\xe9.png"
    spec = tfrecords.RecordSpec.for_format("raw", SIZE)
    assert predict_inputs.stored_names([str(out / manifest["splits"]["test"]["files"][0])], spec) == ["caf\\xe9.png"]


@pytest.mark.integration
@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_shards_are_detected_and_read(tmp_path, compression):
    make_pets(tmp_path / "in", per_class=4)
    assert main([str(tmp_path / "in"), str(tmp_path / "out"), "--image-size", str(SIZE), "--workers", "1",
                 "--compression", compression]) == 0  # fmt: skip
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["compression"] == compression
    files = [str(tmp_path / "out" / name) for name in manifest["splits"]["train"]["files"]]
    assert tfrecords.detect_compression(files[0]) == compression
    typed = {"gzip": "GZIP", "zlib": "ZLIB"}[compression]
    assert sum(1 for _ in tf.data.TFRecordDataset(files, compression_type=typed)) == 8


@pytest.mark.slow
@pytest.mark.integration
def test_the_converter_checks_what_it_wrote_for_duplicates_leakage_and_two_labels(tmp_path, caplog):
    folder = tmp_path / "in"
    make_pets(folder, per_class=8)
    for index in range(8):  # every cat twice: whatever the split, some copy lands in another split or beside itself
        (folder / "Cat" / f"copy{index}.png").write_bytes((folder / "Cat" / f"{index}.png").read_bytes())
    (folder / "Cat" / "dog0.png").write_bytes((folder / "Dog" / "0.png").read_bytes())  # a dog filed as a cat
    manifest = convert(folder, tmp_path / "out", ConvertOptions(image_size=SIZE, val_fraction=0.25, workers=1))
    report = json.loads((tmp_path / "out" / "data_check.json").read_text())
    pairs = [sorted(entry["examples"]) for entry in report["leakage"]] + [
        sorted(group) for groups in report["duplicates"].values() for group in groups
    ]
    expected = [[f"Cat/{index}.png", f"Cat/copy{index}.png"] for index in range(8)] + [["Cat/dog0.png", "Dog/0.png"]]
    assert sorted(pairs) == sorted(expected)
    assert manifest["check"]["duplicates"] + manifest["check"]["leakage"] == 9
    [conflict] = report["conflicts"]
    named = sorted(zip(conflict["examples"], conflict["labels"], strict=True))
    assert named == [("Cat/dog0.png", "Cat"), ("Dog/0.png", "Dog")]
    assert manifest["check"]["conflicts"] == 1 and "1 of them under two labels" in caplog.text
    assert "The same image is written" in caplog.text
    assert report["per_class"]["train"]["Dog"] == 6


@pytest.mark.integration
def test_the_converter_lists_a_folder_as_dataset_folder_does_and_escapes_control_characters(tmp_path, caplog):
    """A symlinked folder inside a class is followed (as `dataset=folder` follows it), and a file name holding a
    newline is one escaped name in the log and the manifest, never a forged line."""
    make_pets(tmp_path / "in", per_class=3)
    make_pets(tmp_path / "more", per_class=2)
    (tmp_path / "in" / "Cat" / "linked").symlink_to(tmp_path / "more" / "Cat", target_is_directory=True)
    (tmp_path / "in" / "Dog" / "evil\nerror: forged.jpg").write_bytes(b"\xff\xd8\xff" + bytes(20))
    with caplog.at_level("WARNING"):
        manifest = convert(tmp_path / "in", tmp_path / "out", OPTIONS)
    assert manifest["splits"]["train"]["per_class"] == {"Cat": 5, "Dog": 3}
    assert [entry["file"] for entry in manifest["skipped"]] == ["Dog/evil\\nerror: forged.jpg"]
    assert not [line for line in caplog.text.splitlines() if line.startswith("error:")]
