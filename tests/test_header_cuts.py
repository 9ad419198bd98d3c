"""A TFRecord file cut inside a frame's 12-byte header: TensorFlow's read ends there without an error, so a pipeline
just gets fewer records. It is a bad record like any broken frame: the data check lists it (with or without the
converter's manifest.json), and training, inspect and predict stop with one line naming the file and record."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import tensorflow as tf
from test_broken_frames import UNREADABLE, _break_frame, _files, _overrides, _predict

from conftest import compose
from trainer.config.store import to_settings
from trainer.errors import DataError
from trainer.tasks import run_task
from trainer.tasks.data import load_data

pytestmark = pytest.mark.integration

CHECK = ["mode=inspect", "inspect.check=true", "inspect.split=val", "inspect.num_images=4"]


def _cut_header(path: Path, index: int) -> None:
    """Keeps 5 of record `index`'s 12 header bytes and nothing after them."""
    data, offset = path.read_bytes(), 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    path.write_bytes(data[: offset + 5])


@pytest.mark.parametrize("manifest", [False, True], ids=["counted_at_start_up", "behind_a_manifest"])
def test_the_data_check_lists_a_file_cut_inside_a_frame_header(tmp_path, manifest, caplog):
    """Without a manifest the check passed, counting val as 7 + 5 (a silent wrong answer); behind one it ended in
    TensorFlow's "expected to contain 17 elements but contained only 12", naming no file."""
    files = _files(tmp_path / "records", manifest)
    cut = files["val"][0]
    _cut_header(cut, 7)
    with pytest.raises(DataError) as error, caplog.at_level(logging.WARNING):
        run_task(compose(_overrides(files, *CHECK), tmp_path / "run"))
    assert str(error.value).startswith(f"data check: 1 bad file(s) or record(s), e.g. {cut}: record 7 {UNREADABLE} ")
    report = json.loads((tmp_path / "run" / "data_check.json").read_text())
    assert report["bad"] == [{"file": f"{cut}: record 7", "record": 7, "reason": UNREADABLE}]
    assert report["num_examples"] == {"train": 12, "val": 7 + 5, "test": 12}
    assert caplog.text.count(f"Bad record {cut}: record 7 {UNREADABLE}") == 1


@pytest.mark.parametrize("manifest", [False, True], ids=["counted_at_start_up", "behind_a_manifest"])
def test_without_the_check_a_file_cut_inside_a_frame_header_stops_inspect_naming_it(tmp_path, manifest):
    """Without a manifest, at start-up (the count reads its bytes); behind one, when the split's read falls short
    of the manifest's count (it was TensorFlow's FailedPreconditionError)."""
    files = _files(tmp_path / "records", manifest)
    _cut_header(files["val"][0], 7)
    with pytest.raises(DataError, match=f"^{files['val'][0]}: corrupted or truncated TFRecord file at record 7$"):
        run_task(compose(_overrides(files, "mode=inspect", "inspect.split=val", "inspect.num_images=4"), tmp_path))


@pytest.mark.slow  # 10 s: trains; the inspect case above meets the same short read and names it the same way
def test_training_behind_a_manifest_stops_at_a_file_cut_inside_a_frame_header_naming_it(tmp_path):
    files = _files(tmp_path / "records", manifest=True)
    _cut_header(files["val"][0], 7)
    train = ["mode=train", "trainer.epochs=1", "evaluate.report=false"]
    with pytest.raises(DataError, match=f"^{files['val'][0]}: corrupted or truncated TFRecord file at record 7$"):
        run_task(compose(_overrides(files, *train), tmp_path / "run"))


@pytest.mark.slow  # 6 s; predict read the cut by its bytes before this change too (no failure on the old code)
def test_predict_behind_a_manifest_writes_every_readable_row_then_names_the_cut(tmp_path):
    files = _files(tmp_path / "records", manifest=True)
    cut = files["val"][0]
    _cut_header(cut, 7)
    line, rows, _ = _predict(tmp_path, files)
    assert line == f"predict.input: {cut}: record 7 {UNREADABLE}; {tmp_path / 'predictions.csv'} holds 13 rows, none " \
        "for the records after it"  # fmt: skip
    assert [row["error"] for row in rows] == [""] * 7 + [f"{cut}: record 7 {UNREADABLE}"] + [""] * 5


@pytest.mark.slow  # 7 s each
@pytest.mark.parametrize(
    ("manifest", "cut", "broken", "readable"),
    [(False, (1, 2), (0, 3), 3 + 2), (True, (0, 9), (1, 3), 9 + 3)],
    ids=["cut_after_the_broken_frame", "cut_before_it_behind_a_manifest"],
)
def test_a_cut_and_a_broken_frame_in_one_split_are_each_listed_once(tmp_path, manifest, cut, broken, readable):
    """No manifest: the count lists val_b's cut at start-up; val_a's broken frame makes the check read val_b again
    (`tfrecords.readable_rest`), which meets the cut a second time. Behind a manifest no file is read at start-up:
    val_a's cut ended its read quietly, val_b's broken frame stopped the check's pass, and the read past it listed
    val_b's frame alone (`tfrecords.cuts_before` reads val_a's frames again)."""
    files = _files(tmp_path / "records", manifest)
    (cut_file, cut_at), (broken_file, broken_at) = (files["val"][cut[0]], cut[1]), (files["val"][broken[0]], broken[1])
    _cut_header(cut_file, cut_at)
    _break_frame(broken_file, broken_at)
    with pytest.raises(DataError, match="data check: 2 bad file"):
        run_task(compose(_overrides(files, *CHECK), tmp_path / "run"))
    report = json.loads((tmp_path / "run" / "data_check.json").read_text())
    expected = sorted([f"{cut_file}: record {cut_at}", f"{broken_file}: record {broken_at}"])
    assert sorted(entry["file"] for entry in report["bad"]) == expected
    assert report["num_examples"]["val"] == readable


@pytest.mark.parametrize("workers", [1, 2], ids=["single_process", "a_workers_share"])
def test_a_training_pass_read_short_of_the_manifests_count_is_named_with_no_cache(tmp_path, workers):
    """dataset.cache=off reads the train file anew each pass: each pass held 7 of the manifest's 12 records and
    training went on without an error (a silent wrong answer). Worker 1's share (records 6-11) held 1 of 6."""
    files = _files(tmp_path / "records", manifest=True)
    manifest = tmp_path / "records" / "manifest.json"
    layout = json.loads(manifest.read_text())
    layout["splits"]["train"]["file_counts"] = [12]  # the shares are planned from it: no file read at start-up
    manifest.write_text(json.dumps(layout))
    cut = files["train"][0]
    _cut_header(cut, 7)
    settings = to_settings(compose(_overrides(files, "dataset.cache=off"))).dataset
    data = load_data(settings, batch_size=4, seed=0, num_workers=workers)
    train = data.train() if workers == 1 else data.train(0, tf.distribute.InputContext(2, 1, 2))
    with pytest.raises(DataError, match=f"^{cut}: corrupted or truncated TFRecord file at record 7$"):
        with data.named_bad_records():
            next(iter(train))


@pytest.mark.slow  # 6 s: trains (12 s on the old code, which trained on); the case above reads the same pipeline
def test_training_behind_a_manifest_with_no_cache_stops_at_a_train_file_cut_inside_a_frame_header(tmp_path):
    """`mode=train` itself: `fit` meets the short pass in its first step and the run ends with the one line."""
    files = _files(tmp_path / "records", manifest=True)
    cut = files["train"][0]
    _cut_header(cut, 7)
    train = ["mode=train", "dataset.cache=off", "trainer.steps_per_epoch=2", "evaluate.report=false"]
    with pytest.raises(DataError, match=f"^{cut}: corrupted or truncated TFRecord file at record 7$"):
        run_task(compose(_overrides(files, *train), tmp_path / "run"))


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_manifest_that_counts_fewer_records_than_its_files_hold_is_named(tmp_path, split):
    """A file changed after its manifest was written: the split's read holds more records than counted. Evaluation
    stopped with tf.data's "expected to contain 15 elements but contained at least 16", naming no file; training
    (dataset.cache=off) took 10 of the 12 each pass without a word."""
    files = _files(tmp_path / "records", manifest=True)
    manifest = tmp_path / "records" / "manifest.json"
    layout = json.loads(manifest.read_text())
    held = layout["splits"][split]["count"]
    layout["splits"][split]["count"] = held - 2
    manifest.write_text(json.dumps(layout))
    data = load_data(to_settings(compose(_overrides(files, "dataset.cache=off"))).dataset, batch_size=4, seed=0)
    pipeline = data.train().take(2 * data.train_steps) if split == "train" else data.split("val")
    line = (
        f"{manifest}: counts {held - 2} records in the {split} split, but its {len(files[split])} file(s) hold {held}: "
    )
    with pytest.raises(DataError, match=f"^{re.escape(line)}"):
        with data.named_bad_records():
            for _ in pipeline:
                pass
