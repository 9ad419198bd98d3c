"""A TFRecord file whose frame is corrupted (its length or checksum bytes flipped): nothing after it can be read.
The data check lists it among the bad records and reads every other file; predict writes every readable row and
ends with one line and a non-zero exit; every bad record reads `FILE: record N REASON`."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from test_tfrecord_input import _tiny_checkpoint

from conftest import compose, csv_rows
from trainer.data import record_writer
from trainer.data.decode import DECODE
from trainer.errors import DataError
from trainer.tasks import run_task

pytestmark = pytest.mark.integration

SIZE = 32
UNREADABLE = "is corrupted or truncated: the rest of the file cannot be read"
UNREADABLE_FROM = (
    "cannot be read: the compressed file is corrupted or truncated at or after it; nothing after it can be read"
)


def _example(label: int, value: int) -> bytes:
    pixels = bytes(np.arange(SIZE * SIZE * 3, dtype=np.uint8) * value % 251)
    features = {"img_raw": record_writer.bytes_feature(pixels), "label": record_writer.int64_feature(label)}
    return record_writer.encode_example(features)


def _write(path: Path, labels: list[int], first_value: int) -> Path:
    with record_writer.RecordFile(str(path)) as shard:
        for index, label in enumerate(labels):
            shard.write(_example(label, first_value + index))
    return path


def _break_frame(path: Path, index: int) -> None:
    """Flips a byte of record `index`'s length checksum: its frame, and so the rest of the file, cannot be read."""
    data, offset = bytearray(path.read_bytes()), 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    data[offset + 9] ^= 0xFF
    path.write_bytes(bytes(data))


def _gzip(paths: list[Path]) -> None:
    """Each file GZIP-compressed in place (a broken frame inside stays broken: the gzip stream itself is whole)."""
    for path in paths:
        path.write_bytes(gzip.compress(path.read_bytes()))


def _predict(tmp_path: Path, files: dict[str, list[Path]]) -> tuple[str, list[dict], dict]:
    """(the error line, the CSV's rows, metrics.json) of predict over the val files, which must fail."""
    output = tmp_path / "predictions.csv"
    predict = ["mode=predict", f"checkpoint={_tiny_checkpoint(tmp_path)}", f"predict.output={output}"]
    predict += [f"predict.input='{tmp_path / 'records'}/val_*.tfrecords'"]  # quoted for Hydra
    with pytest.raises(DataError) as error:
        run_task(compose(_overrides(files, *predict), tmp_path / "run"))
    return str(error.value), csv_rows(output), json.loads((tmp_path / "run" / "metrics.json").read_text())


def _files(folder: Path, manifest: bool, val_labels: list[int] | None = None) -> dict[str, list[Path]]:
    """train (12 records), val (val_labels, or 12, then 5 more in a second file), test (12); with `manifest`, the
    converter's manifest.json beside them, so no file is read whole at start-up."""
    folder.mkdir()
    val_labels = val_labels or [index % 2 for index in range(12)]
    files = {
        "train": [_write(folder / "train.tfrecords", [index % 2 for index in range(12)], 1)],
        "val": [
            _write(folder / "val_a.tfrecords", val_labels, 20),
            _write(folder / "val_b.tfrecords", [0, 1] * 2 + [0], 40),
        ],
        "test": [_write(folder / "test.tfrecords", [index % 2 for index in range(12)], 60)],
    }
    if manifest:
        counts = {"train": 12, "val": len(val_labels) + 5, "test": 12}
        splits = {
            split: {"files": [path.name for path in paths], "count": counts[split], "per_class": {}}
            for split, paths in files.items()
        }
        layout = {"format": "raw", "image_size": SIZE, "resize": "resize", "decode": DECODE}
        (folder / "manifest.json").write_text(json.dumps({**layout, "class_names": ["cat", "dog"], "splits": splits}))
    return files


def _overrides(files: dict[str, list[Path]], *extra: str) -> list[str]:
    listed = {split: ",".join(str(path) for path in paths) for split, paths in files.items()}
    return [
        "dataset=cats_dogs",
        *(f"dataset.{split}_files=[{paths}]" for split, paths in listed.items()),
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        "debug=smoke",
        "trainer.batch_size=4",
        *extra,
    ]


@pytest.mark.parametrize(
    "manifest",
    [pytest.param(False, marks=pytest.mark.slow), True],  # slow: 7 s; the broken first frame's case counts too
    ids=["counted_at_start_up", "behind_a_manifest"],
)
def test_the_data_check_lists_a_corrupted_frame_and_reads_every_other_file(tmp_path, manifest, caplog):
    files = _files(tmp_path / "records", manifest)
    broken = files["val"][0]
    _break_frame(broken, 7)
    run_dir = tmp_path / "run"
    with pytest.raises(DataError) as error, caplog.at_level(logging.WARNING):
        check = ["mode=inspect", "inspect.check=true", "inspect.split=val", "inspect.num_images=16"]
        run_task(compose(_overrides(files, *check), run_dir))  # the sheet and its counts read the broken file too
    line = str(error.value)
    assert line.startswith(f"data check: 1 bad file(s) or record(s), e.g. {broken}: record 7 {UNREADABLE} (see ")
    report = json.loads((run_dir / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{broken}: record 7", "record": 7, "reason": UNREADABLE}]
    # The 7 records before the frame and the other val file are checked; so are the other splits.
    assert report["num_examples"] == {"train": 12, "val": 7 + 5, "test": 12}
    assert f"Bad record {broken}: record 7 {UNREADABLE}" in caplog.text
    assert json.loads((run_dir / "inspect.json").read_text())["per_class"] == {"cat": 4 + 3, "dog": 3 + 2}


def test_without_the_check_a_corrupted_frame_still_stops_inspect_at_start_up(tmp_path):
    files = _files(tmp_path / "records", manifest=False)
    _break_frame(files["val"][0], 7)
    with pytest.raises(DataError, match=f"{files['val'][0]}: corrupted or truncated TFRecord file at record 7$"):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.split=val", "inspect.num_images=4"), tmp_path))


def test_the_data_checks_bad_record_line_is_file_record_reason(tmp_path, caplog):
    """`FILE: record N REASON`, as training and predict say it: not `FILE: record N: REASON`."""
    labels = [0, 1, 5, 1, 0]  # record 2: a label outside the 2 classes (found as the check reads, behind a manifest)
    files = _files(tmp_path / "records", manifest=True, val_labels=labels)
    with pytest.raises(DataError) as error, caplog.at_level(logging.WARNING):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.check=true", "inspect.num_images=4"), tmp_path))
    expected = f"{files['val'][0]}: record 2 has label 5, expected 0 to 1"
    assert f"e.g. {expected}" in str(error.value)
    assert f"Bad record {expected}" in caplog.text


def test_predict_writes_every_readable_row_then_fails_naming_the_file_and_record(tmp_path):
    """Rows 8-11 of the broken file cannot be read: the CSV cannot say so, the exit does (non-zero, one line),
    and the rows written stay, the other file's included."""
    files = _files(tmp_path / "records", manifest=False)
    broken, other = files["val"]
    _break_frame(broken, 7)
    output = tmp_path / "predictions.csv"
    predict = ["mode=predict", f"checkpoint={_tiny_checkpoint(tmp_path)}", f"predict.output={output}"]
    predict += [f"predict.input='{tmp_path / 'records'}/val_*.tfrecords'"]  # quoted for Hydra
    with pytest.raises(DataError) as error:
        run_task(compose(_overrides(files, *predict), tmp_path / "run"))
    assert str(error.value) == (
        f"predict.input: {broken}: record 7 {UNREADABLE}; {output} holds 13 rows, none for the records after it"
    )
    rows = csv_rows(output)
    assert [row["file"] for row in rows] == ["val_a.tfrecords"] * 8 + ["val_b.tfrecords"] * 5
    assert [row["error"] for row in rows] == [""] * 7 + [f"{broken}: record 7 {UNREADABLE}"] + [""] * 5
    assert all(row["predicted_class"] for row in rows[:7] + rows[8:])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rows"] == 13 and metrics["unread"] == [f"{broken}: record 7 {UNREADABLE}"]


def test_the_data_check_lists_bad_records_in_file_order_around_a_corrupted_frame(tmp_path):
    labels = [0, 1, 0, 1, 0, 5, 0, 1, 0, 1, 0, 1]  # record 5: a label outside the classes, read with the frame's batch
    files = _files(tmp_path / "records", manifest=True, val_labels=labels)
    broken = files["val"][0]
    _break_frame(broken, 7)
    with pytest.raises(DataError, match=f"data check: 2 bad file\\(s\\) or record\\(s\\), e.g. {broken}: record 5 has"):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.check=true", "inspect.num_images=4"), tmp_path))
    report = json.loads((tmp_path / "data_check.json").read_text())
    assert [entry["file"] for entry in report["bad"]] == [f"{broken}: record 5", f"{broken}: record 7"]
    assert report["num_examples"]["val"] == 6 + 5


def test_predict_on_a_gzip_file_predicts_the_records_before_its_error_and_names_the_first_unreadable_one(tmp_path):
    """A compressed file stops at its error in a batch (of 4 here): the batch is read again a record at a time, so
    records 4 and 5 are predicted too and the line names record 6, the first that cannot be read, saying the damage
    is at or after it (the decompressor may hold back records read before it)."""
    files = _files(tmp_path / "records", manifest=False)
    broken = files["val"][0]
    _break_frame(broken, 6)
    _gzip(files["val"])
    line, rows, _ = _predict(tmp_path, files)
    expected = f"{broken}: record 6 {UNREADABLE_FROM}"
    output = tmp_path / "predictions.csv"
    assert line == f"predict.input: {expected}; {output} holds 12 rows, none for the records after it"
    assert [row["file"] for row in rows] == ["val_a.tfrecords"] * 7 + ["val_b.tfrecords"] * 5
    assert [row["error"] for row in rows] == [""] * 6 + [expected] + [""] * 5
    assert all(row["predicted_class"] for row in rows[:6] + rows[7:])


def test_a_broken_first_record_is_named_and_takes_no_label_from_the_other_files(tmp_path):
    """Record 0's frame broken: its own row says so (not 'not a TFRecord file' at start-up), and the other
    file's rows keep their true classes, with an accuracy (its broken first record decided 'unlabeled')."""
    files = _files(tmp_path / "records", manifest=False)
    broken = files["val"][0]
    _break_frame(broken, 0)
    line, rows, metrics = _predict(tmp_path, files)
    assert line.startswith(f"predict.input: {broken}: record 0 {UNREADABLE}; ")
    assert [row["error"] for row in rows] == [f"{broken}: record 0 {UNREADABLE}"] + [""] * 5
    assert [row["true_class"] for row in rows[1:]] == ["cat", "dog", "cat", "dog", "cat"]
    assert metrics["labeled"] == 5 and metrics["accuracy"] is not None


def test_without_the_check_a_broken_first_frame_stops_inspect_naming_it(tmp_path):
    files = _files(tmp_path / "records", manifest=False)
    _break_frame(files["val"][0], 0)
    with pytest.raises(DataError, match=f"{files['val'][0]}: corrupted or truncated TFRecord file at record 0$"):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.split=val", "inspect.num_images=4"), tmp_path))


@pytest.mark.slow  # 6 s; the default suite keeps predict's GZIP case (the same re-read and wording)
def test_the_data_check_counts_a_gzip_files_readable_records_and_says_at_or_after(tmp_path):
    files = _files(tmp_path / "records", manifest=False)
    broken = files["val"][0]
    _break_frame(broken, 7)
    _gzip(files["val"])
    with pytest.raises(DataError, match=f"e.g. {broken}: record 7 cannot be read: the compressed file is corrupted"):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.check=true", "inspect.num_images=4"), tmp_path))
    report = json.loads((tmp_path / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{broken}: record 7", "record": 7, "reason": UNREADABLE_FROM}]
    assert report["num_examples"]["val"] == 7 + 5


def test_the_data_check_lists_a_broken_first_frame_and_checks_every_other_file(tmp_path):
    files = _files(tmp_path / "records", manifest=False)
    broken = files["val"][0]
    _break_frame(broken, 0)
    with pytest.raises(DataError, match=f"e.g. {broken}: record 0 {UNREADABLE} \\(see "):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.check=true", "inspect.num_images=4"), tmp_path))
    report = json.loads((tmp_path / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{broken}: record 0", "record": 0, "reason": UNREADABLE}]
    assert report["num_examples"] == {"train": 12, "val": 5, "test": 12}
