"""`dataset=parquet`: Parquet files (the Hub's layout) and `save_to_disk` folders of Arrow streams, made here with
pyarrow (and once by `datasets` itself), trained on directly; each bad input is one line."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import compose, run_cli
from trainer.config.store import to_settings
from trainer.errors import ConfigError, DataError
from trainer.tasks import run_task
from trainer.tasks.data import load_data

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

COLOURS = {"cat": (220, 40, 40), "dog": (40, 40, 220), "fox": (40, 200, 40)}
NAMES = list(COLOURS)
rng = np.random.default_rng(0)


def _encoded(name: str, index: int) -> bytes:
    """An image whose colour is its class, PNG or JPEG by turns, of varied size."""
    shape = (int(rng.integers(24, 48)), int(rng.integers(24, 48)), 3)
    pixels = np.clip(np.array(COLOURS[name]) + rng.normal(0, 8, shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG" if index % 2 else "PNG", quality=95)
    return buffer.getvalue()


def _table(labels: list[int], struct: bool = True, class_label: bool = True):
    """Rows of (image, label); `struct`: the Image feature's {bytes, path}; `class_label`: the `huggingface`
    schema metadata naming the classes, as `datasets` writes it."""
    images = [_encoded(NAMES[label % len(NAMES)], index) for index, label in enumerate(labels)]
    column = pa.array(images, pa.binary())
    if struct:
        paths = pa.array([f"{index}.png" for index in range(len(images))], pa.string())
        column = pa.StructArray.from_arrays([column, paths], names=["bytes", "path"])
    table = pa.table({"image": column, "label": pa.array(labels, pa.int64())})
    if class_label:
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": NAMES}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})})
    return table


def _per_class(count: int, num_classes: int = 3) -> list[int]:
    return [label for _ in range(count) for label in range(num_classes)]


def make_hub(root: Path, per_class: int = 4, train_files: int = 2, **table) -> Path:
    """The Hub's layout: `root/data/{train-0000N-of-0000M,validation-00000-of-00001,test-00000-of-00001}.parquet`."""
    (root / "data").mkdir(parents=True)
    for split, files in (("train", train_files), ("validation", 1), ("test", 1)):
        labels = _per_class(per_class)
        for index in range(files):
            name = f"{split}-{index:05d}-of-{files:05d}.parquet"
            pq.write_table(_table(labels[index::files], **table), root / "data" / name, row_group_size=3)
    return root


def make_saved(root: Path, per_class: int = 4) -> Path:
    """`datasets`' `save_to_disk` layout: `root/<split>/data-*.arrow` (IPC streams) and `dataset_info.json`."""
    for split in ("train", "validation", "test"):
        (root / split).mkdir(parents=True)
        table = _table(_per_class(per_class), struct=False, class_label=False)
        with pa.ipc.new_stream(root / split / "data-00000-of-00001.arrow", table.schema) as writer:
            writer.write_table(table, max_chunksize=5)
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": NAMES}}
        (root / split / "dataset_info.json").write_text(json.dumps({"features": features}))
    return root


def make_with_datasets(root: Path, per_class: int = 4) -> Path:
    """A `DatasetDict` of {image: Image(), label: ClassLabel} saved by the `datasets` library itself."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    splits = {}
    for split in ("train", "validation", "test"):
        labels = _per_class(per_class)
        images = [{"bytes": _encoded(NAMES[label], index), "path": None} for index, label in enumerate(labels)]
        splits[split] = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    datasets.DatasetDict(splits).save_to_disk(str(root))
    return root


def make_plain(root: Path, per_class: int = 8, num_classes: int = 3) -> Path:
    """`root/train.parquet` and `root/test.parquet`, binary images and no metadata: no val split, no names."""
    root.mkdir(parents=True)
    pq.write_table(_table(_per_class(per_class, num_classes), False, False), root / "train.parquet", row_group_size=4)
    pq.write_table(_table(_per_class(2, num_classes), False, False), root / "test.parquet")
    return root


def _settings(root: Path, *extra: str):
    overrides = ["dataset=parquet", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke", *extra]
    return to_settings(compose(overrides))


def _images(dataset: tf.data.Dataset, class_names: list[str]) -> list[bytes]:
    """Each image's pixels; asserts its colour is its label's class colour (by index: "0" is cat's colour)."""
    seen = []
    for images, labels in dataset:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            colour = np.array(COLOURS[NAMES[label]])
            assert np.abs(image.reshape(-1, 3).mean(0) - colour).max() < 20, "the label travels with its image"
            seen.append(image.tobytes())
    return seen


LAYOUTS = {  # layout: (maker, overrides, class names, records per split)
    "hub": (make_hub, [], NAMES, {"train": 12, "val": 12, "test": 12}),
    "save_to_disk": (make_saved, [], NAMES, {"train": 12, "val": 12, "test": 12}),
    "datasets_library": (make_with_datasets, [], NAMES, {"train": 12, "val": 12, "test": 12}),
    "plain_val_fraction": (
        make_plain,
        ["dataset.val_fraction=0.25"],
        ["0", "1", "2"],
        {"train": 18, "val": 6, "test": 6},
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_gives_every_split_with_its_class_names_and_labels(tmp_path, layout):
    make, extra, names, counts = LAYOUTS[layout]
    data = load_data(_settings(make(tmp_path / layout), *extra).dataset, batch_size=4, seed=0)
    assert data.class_names == names and data.num_examples == counts
    assert data.class_counts["train"] == dict(zip(names, [counts["train"] // 3] * 3, strict=True))
    seen = {split: _images(data.split(split), names) for split in ("train", "val", "test")}
    assert [len(seen["train"]), len(seen["val"]), len(seen["test"])] == list(counts.values())
    assert len(_images(data.train().take(3), names)) == 12, "training batches too"
    if layout == "plain_val_fraction":  # the held-out rows are not trained on
        assert not set(seen["train"]) & set(seen["val"])
        assert data.class_counts["val"] == {"0": 2, "1": 2, "2": 2}


@pytest.mark.slow
@pytest.mark.integration
def test_training_on_parquet_files_reports_the_split_sizes(tmp_path):
    root = make_hub(tmp_path / "hub", per_class=4)
    overrides = ["dataset=parquet", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke",
                 "trainer.batch_size=4", "trainer.steps_per_epoch=2"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_examples"] == {"train": 12, "val": 12, "test": 12}


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, extra", [("two_files", []), ("one_file_held_out", ["dataset.val_fraction=0.34"])], ids=str
)
def test_each_worker_reads_its_own_rows(tmp_path, case, extra):
    if case == "two_files":  # whole files: one each
        root = make_hub(tmp_path / case, per_class=4, train_files=2)
    else:  # one file: row ranges of the rows left after the hold-out
        root = tmp_path / case
        root.mkdir()
        pq.write_table(_table(_per_class(6, 2), False, False), root / "train.parquet", row_group_size=3)
    # The photo recipe's random-resized crop (conf/dataset_model/photos.yaml) is cut on the host and changes the
    # pixels: switched off, each training image is its row's plain image, so the pixels name the rows each share read.
    settings = _settings(root, "dataset.augment.crop=none", *extra)
    data = load_data(settings.dataset, batch_size=4, seed=0, num_workers=2)
    per_worker = data.num_examples["train"] // 2
    assert data.train_steps == per_worker // 2
    seen = []
    for index in range(2):
        share = data.train(0, tf.distribute.InputContext(2, index, 2))  # 2 replicas: 2 images a step
        for images, _ in share.take(data.train_steps):
            seen += [image.tobytes() for image in images.numpy()]
    assert len(seen) == 2 * per_worker and len(set(seen)) == len(seen), "the shares are disjoint"
    assert set(seen) == set(_images(data.split("train"), data.class_names)), "and cover the train split once"


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    empty = tmp_path / "empty"
    (empty / "data").mkdir(parents=True)
    (empty / "data" / "README.md").write_text("no parquet here")
    bad_label = tmp_path / "bad_label"
    bad_label.mkdir()
    pq.write_table(_table([0, 1, 5, 2]), bad_label / "train.parquet")
    pq.write_table(_table([0, 1, 2]), bad_label / "validation.parquet")
    return {
        "missing": (tmp_path / "nowhere", []),
        "no_train_files": (empty, []),
        "no_column": (make_hub(tmp_path / "hub", per_class=1, train_files=1), ["dataset.image_column=img"]),
        "bad_label": (bad_label, []),
        "no_val_split": (make_plain(tmp_path / "plain", per_class=1), []),
    }


BAD = {
    "missing": r"dataset.data_dir=.*nowhere: no such folder",
    "no_train_files": r"empty: no file of the train split \(dataset.train_split=train\); expected .*train.parquet",
    "no_column": r"train-00000-of-00001.parquet: no column 'img' \(dataset.image_column\); its columns are "
    r"\['image', 'label'\]",
    "bad_label": r"bad_label/train.parquet: row 2 has label 5, outside the 3 classes",
    "no_val_split": r"no validation split \(dataset.val_split; val, validation and valid are found alike\); found "
    r"\['train', 'test'\]: .*dataset.val_fraction",
}


@pytest.mark.unit
def test_each_bad_input_is_one_line_naming_it(tmp_path):
    inputs = _bad_inputs(tmp_path)
    for case, pattern in BAD.items():
        root, extra = inputs[case]
        with pytest.raises(DataError, match=pattern):
            load_data(_settings(root, *extra).dataset, 4, 0)


def make_string_labels(root: Path, per_class: int = 4) -> Path:
    """`root/{train,validation}.parquet` written by pandas: the label column holds class names (`large_string`
    in pandas 3; `string` in older pandas)."""
    pandas = pytest.importorskip("pandas")
    root.mkdir(parents=True)
    for split in ("train", "validation"):
        labels = [NAMES[label] for label in _per_class(per_class)]
        images = [_encoded(name, index) for index, name in enumerate(labels)]
        pandas.DataFrame({"image": images, "label": labels}).to_parquet(root / f"{split}.parquet")
    return root


@pytest.mark.integration
@pytest.mark.parametrize(
    "extra, names",
    [([], sorted(NAMES)), (["dataset.class_names=[fox,cat,dog]"], ["fox", "cat", "dog"])],
    ids=["sorted_strings", "class_names"],
)
def test_string_labels_are_class_names(tmp_path, extra, names):
    """pandas and polars write string labels as `large_string`: the part refused them ('holds large_string;
    expected integer labels'), even with dataset.class_names given."""
    root = make_string_labels(tmp_path / "strings", per_class=2)
    assert pq.read_schema(root / "train.parquet").field("label").type in (pa.large_string(), pa.string())
    data = load_data(_settings(root, *extra).dataset, batch_size=4, seed=0)
    assert data.class_names == names and data.class_counts["train"] == {name: 2 for name in names}
    for split in ("train", "val"):
        for images, labels in data.split(split):
            for image, label in zip(images.numpy(), labels.numpy(), strict=True):
                colour = np.array(COLOURS[names[label]])
                assert np.abs(image.reshape(-1, 3).mean(0) - colour).max() < 20, "the label names its image's class"


@pytest.mark.unit
def test_a_string_label_outside_the_classes_is_one_line_naming_its_row(tmp_path):
    root = make_string_labels(tmp_path / "strings", per_class=1)
    with pytest.raises(DataError, match=r"train.parquet: row 2 has label 'fox' \(column 'label'\), none of the "
                       r"classes of dataset.class_names \['cat', 'dog'\]"):  # fmt: skip
        load_data(_settings(root, "dataset.class_names=[cat,dog]").dataset, 4, 0)
    pq.write_table(pa.table({"image": [_encoded("cat", 0)], "label": ["cow"]}),
                   root / "validation.parquet")  # fmt: skip
    with pytest.raises(DataError, match=r"validation.parquet: row 0 has label 'cow' .*of the train split's labels"):
        load_data(_settings(root).dataset, 4, 0)


@pytest.mark.unit
def test_without_pyarrow_the_part_names_the_extra(monkeypatch):
    from trainer.data.formats.parquet import ArrowFiles

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` then raises ImportError
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[parquet\]"'):
        ArrowFiles(data_dir="anywhere", image_size=32).load()


@pytest.mark.integration
@pytest.mark.slow
def test_the_folds_of_parquet_rows_partition_train_and_val(tmp_path):
    root = make_hub(tmp_path / "hub")
    plain = load_data(_settings(root).dataset, batch_size=4, seed=0)
    pool = sorted(_images(plain.split("train"), NAMES) + _images(plain.split("val"), NAMES))
    vals = []
    for fold in (0, 1):
        data = load_data(_settings(root, "dataset.folds=2", f"dataset.fold={fold}").dataset, batch_size=4, seed=0)
        train, val = _images(data.split("train"), NAMES), _images(data.split("val"), NAMES)
        assert sorted(train + val) == pool and data.class_counts["val"] == {name: 4 for name in NAMES}
        vals += val
    assert sorted(vals) == pool, "the validation folds partition train and val"


@pytest.mark.unit
@pytest.mark.parametrize("name", ["val", "validation", "valid"])
def test_every_name_of_the_validation_split_is_found_and_two_are_one_line(tmp_path, name):
    root = make_plain(tmp_path / "plain", num_classes=2)
    pq.write_table(_table(_per_class(2, 2), False, False), root / f"{name}.parquet")
    data = load_data(_settings(root, "dataset.class_names=[cat,dog]").dataset, 4, 0)
    assert data.num_examples["val"] == 4
    other = "validation" if name != "validation" else "val"
    pq.write_table(_table(_per_class(2, 2), False, False), root / f"{other}.parquet")
    first, second = sorted([name, other], key=["val", "validation", "valid"].index)
    with pytest.raises(DataError, match=f"both '{first}' and '{second}' look like the validation split; keep one"):
        load_data(_settings(root, "dataset.class_names=[cat,dog]").dataset, 4, 0)


def _truncated_jpeg() -> bytes:
    whole = _encoded("cat", 1)  # odd index: a JPEG
    return whole[: len(whole) // 2]


BAD_IMAGES = {  # case: (row, the image there, what the line says after the file)
    "null": (3, None, r"row 3: no image \(a null in column 'image'\)"),
    "garbage": (5, b"these bytes are no image at all", "record 5 cannot be decoded: not a JPEG, PNG, GIF, BMP or WebP"),
    "empty": (2, b"", r"record 2 has no image \(a null or empty bytes in the image column\)"),
    "truncated_jpeg": (4, _truncated_jpeg(), "record 4 cannot be decoded: corrupt or truncated image"),
    "truncated_held_out": (7, _truncated_jpeg(), "record 7 cannot be decoded: corrupt or truncated image"),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_a_bad_image_stops_training_with_one_line_naming_its_file_and_row(tmp_path, case, monkeypatch):
    """A null or undecodable image stopped training with 'bad input data: not a JPEG, ...', naming no file or
    row; then the image column was read again in Python to name it. The pipeline names it now, from the row's
    provenance and the decoder's reason (Parquet files are records: training stops), and nothing is read again:
    every read of the files is the pipeline's (image and label columns), none of the image column alone. Held
    out by dataset.val_fraction, the row is still its row in the file, not its place among the split's rows."""
    from trainer.data import parquet_rows

    row, image, reason = BAD_IMAGES[case]
    root = make_plain(tmp_path / case, per_class=3)  # train.parquet: 9 rows, test.parquet: 6
    if case != "truncated_held_out":
        pq.write_table(_table(_per_class(2), False, False), root / "validation.parquet")
    table = pq.read_table(root / "train.parquet")
    images = table.column("image").to_pylist()
    images[row] = image
    table = table.set_column(0, "image", pa.array(images, pa.binary()))
    pq.write_table(table, root / "train.parquet", row_group_size=4)  # the bad row in the second row group
    line = rf"^{re.escape(str(root / 'train.parquet'))}: {reason}"
    extra = ["dataset.val_fraction=0.34"] if case == "truncated_held_out" else []
    if case == "null":  # found at start-up (tests/test_parquet.py::test_a_null_image_in_the_test_split_...)
        with pytest.raises(DataError, match=line) as caught:
            load_data(_settings(root).dataset, batch_size=4, seed=0)
    else:
        data = load_data(_settings(root, *extra).dataset, batch_size=4, seed=0)
        reads, batches = [], parquet_rows._batches
        monkeypatch.setattr(parquet_rows, "_batches", lambda path, kind, columns, *rest: reads.append(columns) or
                            batches(path, kind, columns, *rest))  # fmt: skip
        with pytest.raises(DataError, match=line.replace("^", "^bad input data: ")) as caught:
            with data.named_bad_records():
                for split in ("val", "train"):
                    for _ in data.split(split) if split == "val" else data.train().take(6):
                        pass
        assert reads and all(columns == ["image", "label"] for columns in reads), "no Python re-read"
    assert "\n" not in str(caught.value)
    if case == "null":  # training itself: one line, exit 1, no traceback
        result = run_cli(["dataset=parquet", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke",
                          "trainer.batch_size=4", f"hydra.run.dir={tmp_path / 'run'}"])  # fmt: skip
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"{root / 'train.parquet'}: row 3: no image (a null in column 'image')" in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("struct", [False, True], ids=["binary", "image_struct"])
def test_a_null_image_in_the_test_split_is_one_line_at_start_up_before_training(tmp_path, struct):
    """A null image in the test split was found only when the test split was evaluated, after training. It is
    found at start-up now: a Parquet file's statistics count its nulls (no image read where there are none)."""
    root = make_plain(tmp_path / "data", per_class=3)
    table = _table(_per_class(2), struct, False)
    column = table.column("image").combine_chunks()
    if struct:  # the Image feature's struct with a null bytes field, as `datasets` writes an image it lacks
        images = column.field("bytes").to_pylist()
        images[4] = None
        column = pa.StructArray.from_arrays([pa.array(images, pa.binary()), column.field("path")], ["bytes", "path"])
    else:
        images = column.to_pylist()
        images[4] = None
        column = pa.array(images, pa.binary())
    pq.write_table(table.set_column(0, "image", column), root / "test.parquet", row_group_size=2)
    pq.write_table(_table(_per_class(2), False, False), root / "validation.parquet")
    with pytest.raises(DataError) as caught:
        load_data(_settings(root).dataset, batch_size=4, seed=0)
    assert str(caught.value) == f"{root / 'test.parquet'}: row 4: no image (a null in column 'image')"


@pytest.mark.integration
def test_predict_on_parquet_gives_a_bad_row_its_reason_and_predicts_the_rest(tmp_path, trained_run):
    """Parquet rows could not be predicted (`.parquet` was read as an image). Now each row travels with its
    file and row through the one pipeline: the corrupt one gets the decoder's reason in its `error` column, the
    rest their predictions, and a label outside the model's classes is a reason too."""
    from conftest import csv_rows

    data, run_dir = trained_run  # a CIFAR model: 10 classes
    labels = [3, 1, 4, 1, 5, 9]
    table = _table(labels, struct=True, class_label=False)
    images = table.column("image").combine_chunks().field("bytes").to_pylist()
    images[2] = _truncated_jpeg()
    column = pa.StructArray.from_arrays(
        [pa.array(images, pa.binary()), table.column("image").combine_chunks().field("path")], ["bytes", "path"]
    )
    labels[4], labels[5] = 12, None  # the model has 10 classes; a null label: an unlabeled row, predicted
    table = table.set_column(0, "image", column).set_column(1, "label", pa.array(labels, pa.int64()))
    pq.write_table(table, tmp_path / "photos.parquet", row_group_size=4)
    output = tmp_path / "predictions.csv"
    overrides = ["mode=predict", f"checkpoint={run_dir}", "dataset=parquet", f"dataset.data_dir={tmp_path}",
                 f"predict.input={tmp_path / 'photos.parquet'}", f"predict.output={output}"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "run"), overrides=overrides)
    rows = csv_rows(output)
    file = tmp_path / "photos.parquet"
    assert [row["id"] for row in rows] == ["0", "1", "2", "3", "4", "5"]
    errors = [row["error"] for row in rows]
    assert errors[2].startswith(f"{file}: record 2 cannot be decoded: corrupt or truncated image")
    label_line = f"{file}: record 4 has label 12, expected 0 to 9 (the model's classes)"
    assert errors[:2] + errors[3:] == ["", "", "", label_line, ""]
    for row, label in zip(rows, labels, strict=True):
        assert bool(row["predicted_class"]) == (not row["error"])
        assert row["true_index"] == ("" if row["error"] or label is None else str(label))
    strings = table.set_column(1, "label", pa.array(["cat", "dog"] * 3))  # no dataset.class_names to read them
    pq.write_table(strings, tmp_path / "photos.parquet")
    run_task(compose(overrides, tmp_path / "run"), overrides=overrides)
    assert [(row["true_index"], bool(row["predicted_class"])) for row in csv_rows(output)[3:]] == [("", True)] * 3


@pytest.mark.integration
def test_the_data_check_lists_each_bad_row_with_its_reason_from_the_pipeline(tmp_path, capsys):
    """`inspect.check=true` stopped at the first bad image (and read the files again to name it). It reads each
    split once through the pipeline now and lists every bad row by its file, row and reason, and counts them."""
    from trainer.tasks.inspect import _check

    root = make_plain(tmp_path / "data", per_class=3)
    pq.write_table(_table(_per_class(2), False, False), root / "validation.parquet")
    table = pq.read_table(root / "train.parquet")
    images = table.column("image").to_pylist()
    images[1], images[6] = b"no image", _truncated_jpeg()
    pq.write_table(table.set_column(0, "image", pa.array(images, pa.binary())), root / "train.parquet")
    settings = _settings(root, "mode=inspect", "inspect.check=true", f"hydra.run.dir={tmp_path / 'check'}")
    settings.output_dir = str(tmp_path / "check")
    with pytest.raises(DataError) as caught:
        _check(settings, load_data(settings.dataset, batch_size=4, seed=0))
    file = root / "train.parquet"
    assert str(caught.value).startswith(f"data check: 2 bad file(s) or record(s), e.g. {file}: record 1 cannot be")
    assert "2 bad" in capsys.readouterr().out
    report = json.loads((tmp_path / "check" / "data_check.json").read_text())
    assert [entry["file"] for entry in report["bad"]] == [f"{file}: record 1", f"{file}: record 6"]
    assert report["bad"][1]["reason"].startswith("cannot be decoded: corrupt or truncated image")
    assert report["num_examples"]["train"] == 7, "the good rows are checked"
