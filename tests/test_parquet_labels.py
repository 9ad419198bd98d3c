"""Parquet's start-up label checks: a train split of one class, and a bad label only in the splits a mode reads.

pytest -n 0 tests/test_parquet_labels.py
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import compose
from trainer.config.store import to_settings
from trainer.errors import DataError
from trainer.tasks.data import load_data

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["cat", "dog", "fox"]


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write(path: Path, labels: list, class_label: bool = True, no_image: int | None = None) -> None:
    """`path`: a row per label (an integer, a string or None), a ClassLabel of `NAMES` for integer labels; the
    row `no_image` has a null image."""
    images = [None if row == no_image else _png() for row in range(len(labels))]
    table = pa.table({"image": pa.array(images, pa.binary()), "label": labels})
    if class_label and not any(isinstance(label, str) for label in labels):
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": NAMES}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _dataset(root: Path, *extra: str):
    overrides = ["dataset=parquet", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke", *extra]
    return to_settings(compose(overrides)).dataset


ONE_CLASS = {  # case: (train labels, the other splits' labels, overrides, the one class named)
    "class_label": ([1] * 6, [0, 1, 2], [], "dog"),
    "integers_held_out": ([1] * 8, [0, 1], ["dataset.val_fraction=0.25"], "1"),
    "strings": (["cat"] * 6, ["cat", "dog"], ["dataset.class_names=[cat,dog]"], "cat"),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", list(ONE_CLASS))
def test_a_train_split_of_one_class_is_refused_at_start_up(tmp_path, case):
    """Training labels all of one value trained a step and only then stopped, with 'evaluate.report: the test
    split holds one class' (red team): the other formats refuse one class at start-up; so does Parquet now.
    Evaluating the test split, which reads no train row, is no refusal."""
    train, others, extra, name = ONE_CLASS[case]
    _write(tmp_path / "train.parquet", train, class_label=case == "class_label")
    for split in ("test", "validation")[: 1 if "dataset.val_fraction=0.25" in extra else 2]:
        _write(tmp_path / f"{split}.parquet", others, class_label=case == "class_label")
    with pytest.raises(DataError) as raised:
        load_data(_dataset(tmp_path, *extra), 4, 0)
    expected = f"dataset.data_dir={tmp_path}: the train split holds one class ({name}); a classifier needs two"
    assert str(raised.value) == expected
    load_data(_dataset(tmp_path, *extra), 4, 0, check_val=False, reads=("test",))


BAD = {"null": None, "outside": 7, "unknown_name": "cow", "no_image": "image"}  # the bad row's label
SPLITS = {  # case: (the file with the bad row, its row, the splits read, dataset.val_fraction, refused)
    "train-file-test": ("train.parquet", 2, ("test",), None, False),  # evaluate of test (no report): no train file
    "train-file-val": ("train.parquet", 2, ("test", "val"), None, False),  # the report's calibration reads val
    "held-out-val": ("train.parquet", 9, ("test", "val"), 0.6, True),  # ... which val_fraction holds out of train
    "kept-in-train": ("train.parquet", 9, ("test", "val"), 0.25, False),  # ... but not every row of its files
    "test-file": ("test.parquet", 1, ("test",), None, True),
    "training": ("train.parquet", 2, None, None, True),  # training reads every split
}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("case", "bad"),
    [(case, "null") for case in SPLITS]
    + [(case, bad) for case in ("train-file-test", "held-out-val") for bad in ("outside", "unknown_name")]
    + [(case, "no_image") for case in ("train-file-val", "held-out-val", "kept-in-train")],
)
def test_the_label_checks_cover_only_the_splits_a_mode_reads(tmp_path, case, bad):
    """mode=evaluate split=test of Parquet data was refused for a bad label in a train row it never reads (as
    binary data was before 7b5474c); with the report, the val rows held out of the train files are checked. A
    null image likewise."""
    file, row, reads, val_fraction, refused = SPLITS[case]
    strings = bad == "unknown_name"
    label = (lambda index: NAMES[index]) if strings else int
    # Row 9 is the only fox: alone of its class, or of its kind when its label is bad, in val_fraction's
    # per-class hold-out, where 0.6 of one row rounds to 1 (held out to val) and 0.25 to 0 (kept in train).
    labels = {"train.parquet": [label(index % 2) for index in range(9)] + [label(2)], "test.parquet": [0, 1, 2]}
    labels["test.parquet"] = [label(index) for index in labels["test.parquet"]]
    if bad != "no_image":
        labels[file][row] = BAD[bad]
    extra = [f"dataset.val_fraction={val_fraction}"] if val_fraction else []
    if strings:
        extra.append("dataset.class_names=[cat,dog,fox]")
    if not val_fraction:
        labels["validation.parquet"] = [label(0), label(1), label(2)]
    for name, values in labels.items():
        _write(tmp_path / name, values, no_image=row if name == file and bad == "no_image" else None)
    dataset = _dataset(tmp_path, *extra)
    if not refused:
        data = load_data(dataset, 4, 0, check_val="val" in reads, reads=reads)
        assert data.class_names == NAMES
        return
    with pytest.raises(DataError, match=rf"^{tmp_path / file}: row {row}:? (has|no) "):
        load_data(dataset, 4, 0, check_val=reads is None or "val" in reads, reads=reads)
