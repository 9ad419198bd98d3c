"""A label outside the classes where the start-up check reads every record (TFRecord files without a manifest, CIFAR
.bin files): the data check lists it among the bad records and writes the rest of its report, as it does behind a
manifest; without the check, training and inspect still refuse it at start-up, in one line."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from test_broken_frames import _files, _overrides

from conftest import cifar_overrides, compose, pattern_records, write_cifar
from trainer.data import record_writer
from trainer.errors import DataError
from trainer.tasks import run_task

pytestmark = pytest.mark.integration

CHECK = ["mode=inspect", "inspect.check=true", "inspect.num_images=4"]
RECORDS_LABEL = (2, "has label 5, expected 0 to 1 (dataset.num_classes=2)")  # (record, reason)
BIN_LABEL = (1, "has label 12, expected 0 to 9 (dataset.num_classes=10)")


def _records(tmp_path):
    """(overrides, the bad file): val_a's record 2 holds label 5 of 2 classes, no manifest."""
    files = _files(tmp_path / "records", manifest=False, val_labels=[0, 1, 5, 1, 0])
    return _overrides(files), files["val"][0]


def _cifar(tmp_path):
    """(overrides, the bad file): data_batch_2.bin's record 1 holds label 12 of 10 classes."""
    cifar = write_cifar(tmp_path / "cifar")
    (cifar / "data_batch_2.bin").write_bytes(pattern_records(np.array([3, 12, 4])))
    return cifar_overrides(cifar), cifar / "data_batch_2.bin"


@pytest.mark.parametrize(
    ("make", "bad_record"), [(_records, RECORDS_LABEL), (_cifar, BIN_LABEL)], ids=["tfrecord", "bin"]
)
def test_the_data_check_lists_a_label_outside_the_classes_and_writes_its_report(tmp_path, make, bad_record, caplog):
    """It stopped the check at start-up with the one line, before any report."""
    overrides, bad = make(tmp_path)
    number, reason = bad_record
    with pytest.raises(DataError) as error, caplog.at_level(logging.WARNING):
        run_task(compose([*overrides, *CHECK], tmp_path / "run"))
    line = f"{bad}: record {number} {reason}"
    assert str(error.value).startswith(f"data check: 1 bad file(s) or record(s), e.g. {line} (see ")
    report = json.loads((tmp_path / "run" / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{bad}: record {number}", "record": number, "reason": reason}]
    assert caplog.text.count(f"Bad record {line}") == 1
    if make is _records:
        assert report["num_examples"] == {"train": 12, "val": 4 + 5, "test": 12}  # every other record checked


@pytest.mark.parametrize(
    ("make", "bad_record", "mode"),
    [(_records, RECORDS_LABEL, "train"), (_records, RECORDS_LABEL, "inspect"), (_cifar, BIN_LABEL, "inspect")],
    ids=["tfrecord-train", "tfrecord-inspect", "bin-inspect"],  # bin in training: test_bad_input (after a step)
)
def test_without_the_check_a_label_outside_the_classes_stops_at_start_up(tmp_path, make, bad_record, mode):
    overrides, bad = make(tmp_path)
    number, reason = bad_record
    split = "inspect.split=val" if make is _records else "inspect.split=train"
    with pytest.raises(DataError, match=f"^{re.escape(f'{bad}: record {number} {reason}')}$"):
        run_task(compose([*overrides, f"mode={mode}", split, "inspect.num_images=4"], tmp_path / "run"))
    assert not (tmp_path / "run" / "history.csv").exists()  # refused before training


def test_a_first_record_the_decoder_refuses_is_listed_by_the_check_and_stops_training_at_start_up(tmp_path):
    """val_a's record 0 holds 5 bytes of pixels (no manifest, so start-up checks each file's first record): the
    check listed nothing, stopping at start-up with the one line before any report."""
    files = _files(tmp_path / "records", manifest=False)
    bad = files["val"][0]
    short = {"img_raw": record_writer.bytes_feature(b"short"), "label": record_writer.int64_feature(0)}
    good = [record.numpy() for record in tf.data.TFRecordDataset(str(bad)).take(4)]
    with record_writer.RecordFile(str(bad)) as shard:
        for record in [record_writer.encode_example(short), *good]:
            shard.write(record)
    line = f"{bad}: record 0 cannot be decoded: 'img_raw' holds 5 bytes, expected 32x32x3 = 3072 (dataset.stored_size)"
    with pytest.raises(DataError) as error:
        run_task(compose([*_overrides(files), *CHECK], tmp_path / "check"))
    assert str(error.value).startswith(f"data check: 1 bad file(s) or record(s), e.g. {line} (see ")
    report = json.loads((tmp_path / "check" / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{bad}: record 0", "record": 0, "reason": line.split(": record 0 ")[1]}]
    assert report["num_examples"]["val"] == 4 + 5  # the file's other records, and the other val file
    with pytest.raises(DataError, match=f"^{re.escape(line)}$"):
        run_task(compose(_overrides(files), tmp_path / "train"))
    assert not (tmp_path / "train" / "history.csv").exists()
