"""`dataset=folder`: class sub-folders of image files trained on directly, each bad case one line, and your own
dataset part (`dataset._target_`) defined right here."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import compose, run_cli
from trainer import quiet
from trainer.config.store import to_settings
from trainer.data.check import check_splits, summarise_sizes
from trainer.data.parts import Splits, two_classes
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import ConfigError, DataError
from trainer.runs.resume import bind_data
from trainer.tasks import run_task
from trainer.tasks.data import load_data

COLOURS = {"cat": (220, 40, 40), "dog": (40, 40, 220), "fox": (40, 200, 40)}


def make_folder(root: Path, layout: str = "tree", per_class: int = 6, classes=("cat", "dog")) -> Path:
    """Image files whose colour is their class: JPEG and PNG of varied sizes, `root/<class>/` (tree) or
    `root/{train,val,test}/<class>/` (splits)."""
    rng = np.random.default_rng(0)
    folders = {"tree": [root], "splits": [root / split for split in ("train", "val", "test")]}[layout]
    for folder in folders:
        for name in classes:
            (folder / name).mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                shape = (int(rng.integers(24, 60)), int(rng.integers(24, 60)), 3)
                pixels = np.clip(np.array(COLOURS[name]) + rng.normal(0, 8, shape), 0, 255).astype(np.uint8)
                suffix = "jpg" if index % 2 else "png"
                Image.fromarray(pixels).save(folder / name / f"{index}.{suffix}", quality=95)
    return root


def _settings(root: Path, *extra: str):
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke", *extra]
    return to_settings(compose(overrides))


def _labels_follow_colours(dataset: tf.data.Dataset, class_names: list[str]) -> int:
    """Asserts each image's dominant colour is its label's class colour; returns the images seen."""
    seen = 0
    for images, labels in dataset:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            colour = np.array(COLOURS[class_names[label]])
            assert np.abs(image.reshape(-1, 3).mean(0) - colour).max() < 20, "the label travels with its image"
            seen += 1
    return seen


@pytest.mark.integration
@pytest.mark.parametrize(
    "layout, extra",
    [
        ("tree", ["dataset.val_fraction=0.25", "dataset.test_fraction=0.25"]),
        pytest.param("splits", [], marks=pytest.mark.slow),  # 15 s; the split folders are read as the tree's are
    ],
)
def test_a_folder_gives_every_split_with_the_labels_of_its_class_folders(tmp_path, layout, extra):
    root = make_folder(tmp_path / "photos", layout, per_class=8 if layout == "tree" else 6)
    data = load_data(_settings(root, *extra).dataset, batch_size=4, seed=0)
    assert data.class_names == ["cat", "dog"] and data.resize_mode == "resize"
    expected = {"tree": {"train": 8, "val": 4, "test": 4}, "splits": {"train": 12, "val": 12, "test": 12}}[layout]
    assert data.num_examples == expected
    for split in ("val", "test", "train"):
        assert _labels_follow_colours(data.split(split), data.class_names) == data.num_examples[split]
    assert _labels_follow_colours(data.train().take(3), data.class_names) == 12, "training batches too"
    files = {split: [entry[0] for entry in part["files"]] for split, part in data.fingerprint.items()}
    assert all(name.split(os.sep)[-2] in ("cat", "dog") for names in files.values() for name in names)
    if layout == "tree":  # one tree: the splits share no file, and the split is fixed by dataset.split_seed
        assert not set(files["train"]) & set(files["val"]) and not set(files["val"]) & set(files["test"])
        again = load_data(_settings(root, *extra, "seed=7").dataset, batch_size=4, seed=7)
        assert again.fingerprint == data.fingerprint, "the split does not follow the training seed"


@pytest.mark.integration
def test_files_that_give_no_image_are_named_left_out_and_counted(tmp_path, caplog):
    root = make_folder(tmp_path / "photos", "splits", per_class=4)
    (root / "train" / "cat" / "Thumbs.db").write_bytes(b"\x00" * 50)
    good = (root / "train" / "dog" / "1.jpg").read_bytes()
    (root / "train" / "dog" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (root / "train" / "dog" / "empty.jpg").write_bytes(b"")
    (root / "train" / "dog" / "png_named.jpg").write_bytes((root / "train" / "dog" / "0.png").read_bytes())
    data = load_data(_settings(root).dataset, batch_size=4, seed=0)
    skipped = {entry["file"]: entry["reason"] for entry in data.skipped}
    assert set(skipped) == {"train/cat/Thumbs.db", "train/dog/truncated.jpg", "train/dog/empty.jpg"}
    assert skipped["train/dog/empty.jpg"] == "empty file"
    assert skipped["train/cat/Thumbs.db"] == "not a JPEG, PNG, GIF, BMP or WebP image"
    assert skipped["train/dog/truncated.jpg"].startswith("corrupt or truncated image")
    assert data.num_examples["train"] == 9, "8 images and the PNG named .jpg"
    assert all(name in caplog.text for name in skipped)


@pytest.mark.integration
def test_a_class_whose_training_files_all_give_no_image_is_one_line_naming_it(tmp_path):
    """A class folder of `Thumbs.db` and `._x.jpg` passed the folder check (it holds files), every file was
    skipped at the decode, and the run trained a 3-class model with 0 images of that class."""
    root = make_folder(tmp_path / "photos", "splits", per_class=2, classes=("cat", "dog", "fox"))
    for path in (root / "train" / "fox").iterdir():
        path.unlink()
    (root / "train" / "fox" / "Thumbs.db").write_bytes(b"\x00" * 50)
    (root / "train" / "fox" / "._x.jpg").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)  # macOS AppleDouble
    pattern = (
        r"class 'fox' has no training image: 2 file\(s\) of it skipped \(train/fox/\._x\.jpg: not a JPEG.*"
        r"train/fox/Thumbs\.db: not a JPEG.*\); every class needs images in the train split"
    )
    with pytest.raises(DataError, match=pattern):
        load_data(_settings(root).dataset, batch_size=2, seed=0)


@pytest.mark.integration
def test_a_corrupt_jpegs_skip_line_is_its_file_and_reason_only(tmp_path, capfd):
    """The reason held TensorFlow's graph trace ('Graph execution error: Detected at node switch_case_1/...' and
    every frame's absolute path), in the log and in data_check.json; libjpeg printed its own lines before it."""
    root = make_folder(tmp_path / "photos", "splits", per_class=2)
    good = (root / "train" / "dog" / "1.jpg").read_bytes()
    (root / "train" / "dog" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    garbled = bytearray(good)
    garbled[200:260] = b"\xff" * 60
    (root / "train" / "dog" / "garbled.jpg").write_bytes(bytes(garbled))
    (root / "train" / "dog" / "header.jpg").write_bytes(good[:30])
    capfd.readouterr()
    data = load_data(_settings(root).dataset, batch_size=2, seed=0)
    reasons = {entry["file"]: entry["reason"] for entry in data.skipped}
    assert set(reasons) == {f"train/dog/{name}.jpg" for name in ("truncated", "garbled", "header")}
    for reason in reasons.values():
        assert re.fullmatch(r"corrupt or truncated image \([^/\n]+\)", reason), reason
        assert "Graph execution" not in reason and "node" not in reason and "File " not in reason, reason
    assert reasons["train/dog/header.jpg"] == "corrupt or truncated image (Invalid JPEG data, size 30)"
    printed = capfd.readouterr().err
    assert not [line for line in printed.splitlines() if quiet.IMAGE_LIBRARIES.match(line)], printed


@pytest.mark.slow
@pytest.mark.integration
def test_training_on_a_folder_records_the_file_list_and_the_skipped_files(tmp_path):
    root = make_folder(tmp_path / "photos", "tree", per_class=8)
    (root / "cat" / "notes.txt").write_text("not an image")
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.val_fraction=0.25", "dataset.image_size=32",
                 "debug=smoke", "trainer.batch_size=4"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["skipped_files"] == 1 and metrics["skipped"][0]["file"] == "cat/notes.txt"
    assert metrics["num_examples"] == {"train": 12, "val": 4, "test": 4}
    listed = json.loads((tmp_path / "run" / "data.json").read_text())
    assert sorted(entry[0] for entry in listed["train"]["files"])[0].startswith("cat")
    info = json.loads(zipfile.ZipFile(tmp_path / "run" / "checkpoints" / "best.keras").read("vggtrain.json"))
    assert info["resize_mode"] == "resize" and info["decode"].startswith("vggtrain-decode-2")


@pytest.mark.slow
@pytest.mark.unit
def test_a_resume_onto_a_changed_file_list_is_one_line_unless_allowed(tmp_path):
    root = make_folder(tmp_path / "photos", "splits", per_class=3)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    bind_data(run_dir, load_data(_settings(root).dataset, 4, 0).fingerprint, None)
    bind_data(run_dir, load_data(_settings(root).dataset, 4, 0).fingerprint, "RUN")  # the same files: no word
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(root / "train" / "cat" / "new.png")
    changed = load_data(_settings(root).dataset, 4, 0).fingerprint
    with pytest.raises(ConfigError, match=r"resume=RUN: the data differs .*train: 6 -> 7 records.*allow_data_change"):
        bind_data(run_dir, changed, "RUN")
    bind_data(run_dir, changed, "RUN", allow_change=True)


def _bad_layouts(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    single = make_folder(tmp_path / "single", classes=("cat",))
    no_images = make_folder(tmp_path / "no_images")
    (no_images / "fox").mkdir()
    train_only = make_folder(tmp_path / "train_only" / "train").parent
    loop = make_folder(tmp_path / "loop")
    os.symlink(loop / "cat", loop / "cat" / "again")
    return {
        "missing": (tmp_path / "nowhere", []),
        "empty": (empty, []),
        "single": (single, ["dataset.val_fraction=0.5"]),
        "no_images": (no_images, ["dataset.val_fraction=0.5"]),
        "train_only": (train_only, []),
        "tree_without_fraction": (make_folder(tmp_path / "tree"), []),
        "loop": (loop, ["dataset.val_fraction=0.5"]),
        "unknown_class": (
            make_folder(tmp_path / "named"),
            ["dataset.val_fraction=0.5", "dataset.class_names=[cat,cow]"],
        ),
    }


BAD = {
    "missing": r"dataset.data_dir=.*nowhere: no such folder",
    "empty": r"empty holds no class folders; expected .*/<class>/ or .*/train/<class>/",
    "single": r"single: one class folder \(cat/\); a classifier needs two",
    "no_images": r"no_images/fox: holds no image files",
    "train_only": r"has train/ but no val/ \(nor validation/, valid/\): add .*/val/<class>/, or set dataset.val_f",
    "tree_without_fraction": r"is one <class>/ tree: set dataset.val_fraction",
    "loop": r"loop/cat/again: a symlink loop",
    "unknown_class": r"dataset.class_names=\['cat', 'cow'\] does not match the class folders .*no folder cow",
}


@pytest.mark.unit
def test_the_class_rule_names_the_one_class_whatever_braces_the_path_holds():
    """A str.format template broke on a folder named `photos{2024}` (KeyError for the refusal's own line)."""
    where = "dataset.data_dir=/data/photos{2024}"
    with pytest.raises(DataError, match=r"^dataset.data_dir=/data/photos\{2024\}: one class folder \(cat/\); a classi"):
        two_classes(["cat"], lambda one: f"{where}: one class folder ({one}/)")
    two_classes(["cat", "dog"], lambda one: "not raised")


@pytest.mark.unit
def test_files_that_are_one_record_each_are_read_by_a_map_in_order_with_their_provenance(tmp_path):
    """An image folder's files are read by one parallel map (no dataset per file: the folder_pipeline row), giving
    what the generic per-range read gives: (entry, record 0, label digits + bytes), in order, and training's
    seeded file orders."""
    from trainer.data.folder import LabeledFileReader

    entries = []
    for index in range(12):
        path = tmp_path / f"{index:02d}.bin"
        path.write_bytes(bytes([index]) * (index + 1))
        entries.append(f"{index % 3:08d}{path}")
    source = Source(Records.whole_files(entries, len(entries)), LabeledFileReader())
    generic = Source(source.records, type("Generic", (), {"parallel": True, "read": LabeledFileReader().read})())
    assert source._one_record_each() and not generic._one_record_each()
    rows = lambda dataset: [tuple(value.numpy() for value in row) for row in dataset]  # noqa: E731
    assert rows(source.in_order()) == rows(generic.in_order())
    assert [row[2] for row in rows(source.in_order())] == [
        f"{index % 3:08d}".encode() + bytes([index]) * (index + 1) for index in range(12)
    ]
    assert rows(source.for_training(3)) == rows(generic.for_training(3))
    shifted = Source(Records(((entries[0], 1, -1),), 0), LabeledFileReader())  # not a whole file: the generic read
    assert not shifted._one_record_each()


@pytest.mark.integration
def test_each_bad_folder_is_one_line_naming_it(tmp_path):
    layouts = _bad_layouts(tmp_path)
    for case, pattern in BAD.items():
        root, extra = layouts[case]
        with pytest.raises(DataError, match=pattern):
            load_data(_settings(root, *extra).dataset, 4, 0)
    result = run_cli(["dataset=folder", f"dataset.data_dir={layouts['train_only'][0]}", "debug=smoke",
                      f"hydra.run.dir={tmp_path / 'cli'}"], cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: dataset.data_dir=")


@pytest.mark.integration
@pytest.mark.slow  # 16 s; the share arithmetic is in the default suite (tests/test_worker_shares.py)
def test_each_worker_reads_its_own_whole_files(tmp_path):
    root = make_folder(tmp_path / "photos", "splits", per_class=4)
    data = load_data(_settings(root).dataset, batch_size=4, seed=0, num_workers=2)
    assert data.train_steps == 2, "8 training files each: 2 steps of 2 per worker"
    seen = []
    for index in range(2):
        share = data.train(0, tf.distribute.InputContext(2, index, 2))  # 2 replicas: 2 images a step
        for images, _ in share.take(2):
            seen += [image.tobytes() for image in images.numpy()]
    assert len(seen) == 8 and len(set(seen)) == 8, "the shares are disjoint and cover the train split once"


# --- your own dataset part ---------------------------------------------------------------------------------------


class StripesSource:
    """A dataset part made in memory: record `i` is the label's digit; its image is a stripe in the label's row.
    Shows the protocol: `load()` returns `Splits` of `Source`s read by any `Reader`, and a batch decoder."""

    def __init__(self, image_size: int, per_split: int = 16, **_: object) -> None:
        self.size, self.count = image_size, per_split

    class Reader:
        parallel = False

        def read_files(self, paths, parallel_reads=None):
            return paths.map(lambda path: tf.strings.substr(path, 0, 1))  # "names" are "<label>-<index>"

        def read(self, path, start, length):
            return self.read_files(tf.data.Dataset.from_tensors(path)).take(length)

    def decode(self, records):
        labels = tf.strings.to_number(records, tf.int32)
        rows = tf.one_hot(labels * (self.size // 2), self.size, dtype=tf.uint8) * 255
        images = tf.tile(rows[:, :, None, None], [1, 1, self.size, 3])
        return images, labels

    def load(self, check_val: bool = True) -> Splits:
        names = [f"{index % 2}-{index}" for index in range(self.count)]
        source = Source(Records.whole_files(names, len(names)), self.Reader())
        splits = {"train": source, "val": source, "test": source}
        fingerprint = {split: {"records": len(names)} for split in splits}  # no files to stat: its own
        files = lambda: (names, [1] * len(names))  # noqa: E731 (the worker shares: one record per "file")
        return Splits(splits, self.decode, ["top", "middle"], files, fingerprint=fingerprint, files=[])


class FloatStripes(StripesSource):
    """Gives float32 images in [0, 1]: the pipeline's cast to uint8 made them black, trained on silently."""

    def decode(self, records):
        images, labels = super().decode(records)
        return tf.cast(images, tf.float32) / 255.0, labels


class EndlessStripes(StripesSource):
    """Its reader never ends: training takes its count, the report's in-order pass crashed after training
    ('expected 24 elements but contained at least 25')."""

    class Reader(StripesSource.Reader):
        def read_files(self, paths, parallel_reads=None):
            return super().read_files(paths).repeat()


class BrokenStripes(StripesSource):
    def load(self, check_val: bool = True) -> Splits:
        raise RuntimeError("the bucket is gone")


OWN_PART_ERRORS = {  # the part: its one line
    "FloatStripes": r"^dataset._target_=test_folder.FloatStripes: its decoder gives float32 images \(values 0 to 1 in "
    r"the first batch\); expected uint8 0-255",
    "EndlessStripes": r"^dataset._target_=test_folder.EndlessStripes: its reader gives more than 24 records of the "
    r"train split .*but its Records count 24",
    "BrokenStripes": r"^dataset._target_=test_folder.BrokenStripes: its load\(\) raised RuntimeError: the bucket "
    r"is gone$",
}


@pytest.mark.integration
def test_a_dataset_part_that_breaks_the_protocol_is_one_line_naming_it_at_start_up(tmp_path):
    for name, pattern in OWN_PART_ERRORS.items():
        overrides = ["dataset=custom", f"dataset._target_=test_folder.{name}", "dataset.per_split=24", "debug=smoke"]
        with pytest.raises(DataError, match=pattern):
            load_data(to_settings(compose(overrides)).dataset, 8, 0)
    assert load_data(to_settings(compose([*overrides[:1], "dataset._target_=test_folder.StripesSource"])).dataset, 8, 0)
    result = run_cli([*overrides, f"hydra.run.dir={tmp_path / 'cli'}"], cwd=tmp_path)  # BrokenStripes
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert re.match(OWN_PART_ERRORS["BrokenStripes"].replace("^", "^error: "), result.stderr.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.integration
def test_a_dataset_part_defined_here_trains_by_target(tmp_path):
    overrides = ["dataset=custom", "dataset._target_=test_folder.StripesSource", "dataset.per_split=24",
                 "debug=smoke", "trainer.batch_size=8", "trainer.epochs=2"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_examples"] == {"train": 24, "val": 24, "test": 24}
    assert set(json.loads((tmp_path / "run" / "data.json").read_text())) == {"train", "val", "test"}


@pytest.mark.slow
@pytest.mark.integration
def test_the_data_check_names_bad_files_duplicates_leakage_and_label_conflicts(tmp_path):
    root = make_folder(tmp_path / "photos", "splits", per_class=3)
    leaked = root / "test" / "dog" / "copy_of_train.png"
    leaked.write_bytes((root / "train" / "dog" / "0.png").read_bytes())
    (root / "train" / "cat" / "twice.png").write_bytes((root / "train" / "cat" / "2.png").read_bytes())
    (root / "val" / "cat" / "Thumbs.db").write_bytes(b"\x00" * 40)
    (root / "val" / "dog" / "filed_as_dog.png").write_bytes((root / "val" / "cat" / "2.png").read_bytes())
    typed = ["mode=inspect", "inspect.check=true", "dataset=folder", f"dataset.data_dir={root}"]
    typed.append("dataset.image_size=32")
    result = run_cli([*typed, f"hydra.run.dir={tmp_path / 'check'}"], cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: data check: 1 bad file(s) or record(s), e.g. val/cat/Thumbs.db: not a JPEG")
    assert "test/dog/copy_of_train.png (test) is train/dog/0.png (train)" in line
    assert "1 image(s) under two labels, e.g. val/cat/2.png (cat) is val/dog/filed_as_dog.png (dog)" in line
    report = json.loads((tmp_path / "check" / "data_check.json").read_text())
    pair = ["val/cat/2.png", "val/dog/filed_as_dog.png"]
    assert report["duplicates"] == {"train": [["train/cat/2.png", "train/cat/twice.png"]], "val": [pair]}
    assert report["per_class"]["test"] == {"cat": 3, "dog": 4} and report["num_examples"]["train"] == 7
    assert report["conflicts"] == [
        {"examples": ["val/cat/2.png", "val/dog/filed_as_dog.png"], "labels": ["cat", "dog"]}
    ]
    assert report["image_sizes"]["count"] == 7 + 7 + 7, "every file that decodes, by its stored size"
    accepted = run_cli([*typed, "inspect.allow=[duplicates,bad]", f"hydra.run.dir={tmp_path / 'ok'}"], cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr[-2000:]


@pytest.mark.unit
def test_the_data_check_summarises_image_sizes_instead_of_listing_each():
    sizes = {f"{300 + index}x{400 + index}": 1 for index in range(297)} | {"3000x4000": 2, "4000x3000": 1, "unknown": 4}
    summary = summarise_sizes(sizes)
    assert summary == {
        "count": 304, "unknown": 4, "min": "300x400", "median": "449x549", "max": "4000x3000", "over_12_mp": 0,
    }  # fmt: skip
    assert summarise_sizes({"4000x3001x3": 3, "32x32x3": 1})["over_12_mp"] == 3  # 12 MP is 4000x3000: above it
    assert summarise_sizes({}) == {"count": 0}


@pytest.mark.unit
def test_the_check_finds_equal_pixels_across_batches_and_splits_and_counts_no_size_for_an_empty_batch():
    """Fingerprints (`tf.fingerprint`) match equal images only; a batch whose every record was bad adds nothing."""
    images = np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3)
    train = [(tf.constant(images[:2]), tf.constant([0, 1])), (tf.constant(images[:0]), tf.constant([], tf.int32)),
             (tf.constant(images[[0, 2]]), tf.constant([0, 0]))]  # fmt: skip
    test = [(tf.constant(images[[2, 3]]), tf.constant([1, 1]))]
    report = check_splits({"train": train, "test": test}, ["a", "b"], lambda split, at: f"{split}{at}")
    assert report["duplicates"] == {"train": [["train0", "train2"]]}
    assert report["leakage"] == [{"splits": ["train", "test"], "examples": ["train3", "test0"]}]
    assert report["num_examples"] == {"train": 4, "test": 2}
    assert report["conflicts"] == [{"examples": ["train3", "test0"], "labels": ["a", "b"]}]  # image 2: a, then b
    assert report["image_sizes"] == {"count": 6, "min": "2x2", "median": "2x2", "max": "2x2", "over_12_mp": 0}
    assert check_splits({"val": train[1:2]}, ["a"], str)["image_sizes"] == {"count": 0}


@pytest.mark.unit
@pytest.mark.parametrize("name", ["validation", "valid"])
def test_a_validation_or_valid_folder_is_the_val_split_and_two_of_them_are_one_line(tmp_path, name):
    root = make_folder(tmp_path / "photos", "splits", per_class=2)
    (root / "val").rename(root / name)
    assert load_data(_settings(root).dataset, 4, 0).num_examples["val"] == 4
    make_folder(root, "splits", per_class=2)  # val/ again, beside it
    with pytest.raises(DataError, match=f"both 'val' and '{name}' look like the validation split; keep one"):
        load_data(_settings(root).dataset, 4, 0)
