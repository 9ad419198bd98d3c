"""`dataset=tfds`: a prepared TensorFlow Datasets folder, made here without any network, read offline as a
dataset part; each bad input is one line.

    nice -n 19 python -m pytest -q -p no:randomly tests/test_tfds.py -n 0
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from trainer.data.formats.tfds import TFDSFiles
from trainer.data.pipeline import eval_dataset
from trainer.data.preprocess import Preprocess
from trainer.data.sources import tfrecord_dataset
from trainer.data.tfds_files import TFDSLoader
from trainer.errors import ConfigError, DataError

COLOURS = {"cat": (220, 40, 40), "dog": (40, 40, 220)}
CLASSES = list(COLOURS)
SIZES = {"train": 12, "validation": 4, "test": 4}


def _images(count: int, seed: int) -> tf.data.Dataset:
    """`count` images of varied sizes whose colour is their class, labels alternating from a seeded start."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for index in range(count):
        label = (index + seed) % 2
        shape = (int(rng.integers(20, 50)), int(rng.integers(20, 50)), 3)
        pixels = np.array(COLOURS[CLASSES[label]]) + rng.normal(0, 8, shape)
        images.append(np.clip(pixels, 0, 255).astype(np.uint8))
        labels.append(label)
    return tf.data.Dataset.from_generator(
        lambda: zip(images, labels, strict=True),
        output_signature=(tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64)),
    ).map(lambda image, label: {"image": image, "label": label})


def _prepare(tfds, data_dir: Path, name: str, splits: dict[str, int], encoding: str, label, num_shards: int = 1):
    """Prepares TFDS dataset `name` (version 1.0.0) in `data_dir` from in-memory images, as `tfds build` would."""
    features = tfds.features.FeaturesDict(
        {"image": tfds.features.Image(shape=(None, None, 3), encoding_format=encoding), "label": label}
    )
    builder = tfds.dataset_builders.TfDataBuilder(
        name=name,
        version="1.0.0",
        data_dir=str(data_dir),
        split_datasets={split: _images(count, seed) for seed, (split, count) in enumerate(splits.items())},
        features=features,
    )
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=num_shards)
    )


class NetworkUsed(OSError):
    pass


def _block_network(patch: pytest.MonkeyPatch) -> list:
    """Makes every connection attempt fail; returns the list that records them."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise NetworkUsed(f"network access during a test: {args}")

    patch.setattr(socket.socket, "connect", refuse)
    patch.setattr(socket.socket, "connect_ex", refuse)
    patch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every connection attempt fails and is recorded; the test then fails if there was one
    (tensorflow/datasets#3962: TFDS can reach for the network even for a prepared folder)."""
    attempts = _block_network(monkeypatch)
    yield attempts
    assert not attempts, f"the network was used: {attempts}"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A TFDS data_dir: `pets` (train, validation, test; PNG), `pets_one` (train in 3 shards and test; JPEG),
    `pets_plain` (an int64 label, no ClassLabel), all prepared with the network blocked."""
    tfds = pytest.importorskip("tensorflow_datasets")
    root = tmp_path_factory.mktemp("tensorflow_datasets")
    with pytest.MonkeyPatch.context() as patch:
        attempts = _block_network(patch)
        if importlib.util.find_spec("importlib_resources") is None:
            # TFDS 4.9.10's builder imports `importlib_resources` but declares it only for Python < 3.9
            # (tensorflow/datasets#11212); the standard library's module answers the same question.
            patch.setitem(sys.modules, "importlib_resources", importlib.resources)
        class_label = tfds.features.ClassLabel(names=CLASSES)
        _prepare(tfds, root, "pets", SIZES, "png", class_label)
        _prepare(tfds, root, "pets_one", {"train": 10, "test": 4}, "jpeg", class_label, num_shards=3)
        _prepare(tfds, root, "pets_plain", {"train": 6, "test": 2}, "png", tfds.features.Scalar(tf.int64))
    assert not attempts, f"preparing the folders used the network: {attempts}"
    return root


def _labels_follow_colours(dataset: tf.data.Dataset, class_names: list[str]) -> list[int]:
    """Asserts each image's mean colour is its label's class colour; returns the labels in order."""
    seen = []
    for images, labels in dataset:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            colour = np.array(COLOURS[class_names[label]])
            assert np.abs(image.reshape(-1, 3).mean(0) - colour).max() < 20, "the label travels with its image"
            seen.append(int(label))
    return seen


@pytest.mark.integration
@pytest.mark.parametrize("where", ["data_dir", "name_folder", "version_folder", "config_folder"])
def test_a_prepared_folder_gives_every_split_with_its_class_names(data_dir, tmp_path, where):
    shutil.copytree(data_dir / "pets" / "1.0.0", tmp_path / "pets" / "small" / "1.0.0")  # NAME/CONFIG/VERSION
    folder = {
        "data_dir": data_dir,
        "name_folder": data_dir / "pets",
        "version_folder": data_dir / "pets" / "1.0.0",
        "config_folder": tmp_path / "pets" / "small",
    }
    splits = TFDSFiles(tfds_name="pets", data_dir=str(folder[where]), image_size=32).load()
    assert splits.class_names == CLASSES
    assert {split: source.count for split, source in splits.sources.items()} == {"train": 12, "val": 4, "test": 4}
    files, counts = splits.train_files()
    assert counts == [12] and files == list(splits.sources["train"].records.files)


@pytest.mark.integration
def test_a_prepared_folders_splits_keep_each_image_beside_its_label(data_dir):
    """Read once, from the data_dir (the test above: every other folder finds the same files)."""
    splits = TFDSFiles(tfds_name="pets", data_dir=str(data_dir), image_size=32).load()
    for split, source in splits.sources.items():
        labels = _labels_follow_colours(eval_dataset(source, splits.decoder, Preprocess(32), 8), splits.class_names)
        assert len(labels) == source.count and set(labels) == {0, 1}, split


@pytest.mark.integration
def test_val_fraction_holds_out_the_tail_of_train_across_its_shards(data_dir):
    part = TFDSFiles(tfds_name="pets_one", data_dir=str(data_dir), image_size=32, val_fraction=0.3)
    splits = part.load()
    train, val = splits.sources["train"].records, splits.sources["val"].records
    assert (train.count, val.count, splits.sources["test"].count) == (7, 3, 4)
    files, counts = splits.train_files()
    assert len(files) == 3 and sum(counts) == 10, "the worker shares plan over the whole shards ..."
    every = [(path, index) for path, count in zip(files, counts, strict=True) for index in range(count)]
    read = [(path, start + index) for path, start, length in train.ranges + val.ranges for index in range(length)]
    assert read == every and len(val.ranges) <= 2, "train is the first 7 records of the shards, val the last 3"
    labels = {}
    for split in ("train", "val"):
        dataset = eval_dataset(splits.sources[split], splits.decoder, Preprocess(32), 4)
        labels[split] = _labels_follow_colours(dataset, splits.class_names)  # JPEG images too
    records = tfrecord_dataset(files)
    in_file_order = splits.decoder(tf.stack(list(records)))[1].numpy().tolist()
    assert labels["train"] + labels["val"] == in_file_order, "val is the last 3 records of the shards read in order"


@pytest.mark.integration
def test_a_label_without_class_label_takes_dataset_class_names(data_dir):
    splits = TFDSFiles(
        tfds_name="pets_plain", data_dir=str(data_dir), image_size=32, val_split="test", class_names=["kitty", "pup"]
    ).load()
    assert splits.class_names == ["kitty", "pup"] and splits.sources["val"].count == 2


@pytest.mark.unit
def test_the_newest_version_is_read_and_a_missing_val_split_is_fine_unless_val_is_read(data_dir, tmp_path):
    for version in ("1.2.0", "1.10.0"):  # numerically newest, not by name
        shutil.copytree(data_dir / "pets_one" / "1.0.0", tmp_path / "pets_one" / version)
    part = TFDSFiles(tfds_name="pets_one", data_dir=str(tmp_path), image_size=32)
    assert TFDSLoader(part).version_dir().name == "1.10.0"
    chosen = TFDSLoader(TFDSFiles(tfds_name="pets_one", data_dir=str(tmp_path), image_size=32, version="1.2.0"))
    assert chosen.version_dir().name == "1.2.0"
    splits = part.load(check_val=False)
    assert splits.sources["val"] == splits.sources["test"] and splits.sources["train"].count == 10


@pytest.mark.integration
def test_a_truncated_shard_is_named_by_find_bad_record(data_dir, tmp_path):
    shutil.copytree(data_dir / "pets", tmp_path / "pets")
    shard = next((tmp_path / "pets" / "1.0.0").glob("pets-train.tfrecord-*"))
    shard.write_bytes(shard.read_bytes()[:-100])
    splits = TFDSFiles(tfds_name="pets", data_dir=str(tmp_path), image_size=32).load()
    with pytest.raises(DataError, match=rf"{shard.name}: corrupted or truncated TFRecord file at record \d+"):
        splits.find_bad_record(tf.errors.DataLossError(None, None, "truncated record"))


@pytest.mark.integration
@pytest.mark.parametrize(
    ("listed", "val_fraction", "split"), [(14, 0.0, "train"), (10, 0.0, "train"), (14, 0.25, "val")]
)
def test_a_shard_that_holds_another_count_than_dataset_info_lists_is_named(
    data_dir, tmp_path, listed, val_fraction, split
):
    """A `dataset_info.json` older than its shards (12 records in train's one shard): tf.data's count assertion
    stops the read; the finder names the shard, what it holds and what the listing says, not tf.data's line."""
    shutil.copytree(data_dir / "pets", tmp_path / "pets")
    info_file = tmp_path / "pets" / "1.0.0" / "dataset_info.json"
    info = json.loads(info_file.read_text())
    next(split for split in info["splits"] if split["name"] == "train")["shardLengths"] = [str(listed)]
    info_file.write_text(json.dumps(info))
    if val_fraction:  # val is the tail of train, a range of its shard: the range past the shard's end is short
        info["splits"] = [part for part in info["splits"] if part["name"] != "validation"]
        info_file.write_text(json.dumps(info))
    splits = TFDSFiles(tfds_name="pets", data_dir=str(tmp_path), image_size=32, val_fraction=val_fraction).load()
    stopped = None
    try:
        for _ in eval_dataset(splits.sources[split], splits.decoder, Preprocess(32), batch_size=4):
            pass
    except tf.errors.FailedPreconditionError as error:
        stopped = error
    assert stopped is not None, "tf.data read a split of another count than its listing without a word"
    shard = next((tmp_path / "pets" / "1.0.0").glob("pets-train.tfrecord-*"))
    with pytest.raises(DataError, match=rf"{shard}: holds 12 records, but {info_file} lists {listed} for it"):
        splits.find_bad_record(stopped)


def _bad_inputs(data_dir: Path, tmp_path: Path) -> dict[str, tuple[dict, str]]:
    shutil.copytree(data_dir / "pets", tmp_path / "array" / "pets")
    info_file = tmp_path / "array" / "pets" / "1.0.0" / "dataset_info.json"
    info = json.loads(info_file.read_text())
    info_file.write_text(json.dumps({**info, "fileFormat": "array_record"}))
    (tmp_path / "garbled" / "pets" / "1.0.0").mkdir(parents=True)
    (tmp_path / "garbled" / "pets" / "1.0.0" / "dataset_info.json").write_text("{not json")
    (tmp_path / "empty" / "pets").mkdir(parents=True)
    shutil.copytree(data_dir / "pets", tmp_path / "one_class" / "pets")
    one_class = tmp_path / "one_class" / "pets" / "1.0.0"
    (one_class / "label.labels.txt").write_text("cat\n")  # the ClassLabel's names: one
    info_text = (one_class / "dataset_info.json").read_text()
    (one_class / "dataset_info.json").write_text(info_text.replace('"numClasses": "2"', '"numClasses": "1"'))
    for config in ("small", "large"):
        shutil.copytree(data_dir / "pets" / "1.0.0", tmp_path / "configs" / "pets" / config / "1.0.0")
    pets, one = {"tfds_name": "pets", "data_dir": str(data_dir)}, {"tfds_name": "pets_one", "data_dir": str(data_dir)}
    return {
        "no_folder": ({**pets, "data_dir": str(tmp_path / "nowhere")}, r"nowhere: no such folder"),
        "no_info": (
            {**pets, "data_dir": str(tmp_path / "empty")},
            r"empty: no dataset_info\.json in .*empty/pets/VERSION/ or .*empty/pets/CONFIG/VERSION/",
        ),
        "wrong_name": (
            {**pets, "tfds_name": "birds"},
            r"no folder birds/ \(dataset\.tfds_name\) and no dataset_info\.json; it holds \['pets', 'pets_one', 'pe",
        ),
        "version": ({**pets, "version": "2.0.0"}, r"dataset\.version=2\.0\.0: not in .*pets, .*versions \['1\.0\.0'\]"),
        "configs": (
            {**pets, "data_dir": str(tmp_path / "configs")},
            r"configs/pets holds several configs \(large, small\); set dataset\.data_dir to .*configs/pets/CONFIG",
        ),
        "name_mismatch": (
            {**pets, "data_dir": str(data_dir / "pets_one" / "1.0.0")},
            r"holds the TFDS dataset 'pets_one', not dataset\.tfds_name='pets'",
        ),
        "train_split": (
            {**pets, "train_split": "training"},
            r"no split 'training' \(dataset\.train_split\); it has \['train', 'validation', 'test'\]",
        ),
        "val_split": (one, r"no split 'validation' \(dataset\.val_split\); it has \['train', 'test'\].*val_fraction"),
        "val_fraction": ({**one, "val_fraction": 0.01}, r"dataset\.val_fraction=0\.01 holds out 0 of the 10 records"),
        "image_key": (
            {**pets, "image_key": "img"},
            r"no feature 'img' \(dataset\.image_key\); it has \['image', 'label'\]",
        ),
        "label_key": (
            {**pets, "label_key": "y"},
            r"no feature 'y' \(dataset\.label_key\); it has \['image', 'label'\]",
        ),
        "not_class_label": (
            {"tfds_name": "pets_plain", "data_dir": str(data_dir), "val_split": "test"},
            r"'label' \(dataset\.label_key\) is a Scalar, not a ClassLabel; dataset\.class_names is needed",
        ),
        "class_names": ({**pets, "class_names": ["a", "b", "c"]}, r"names 3 classes but .*ClassLabel 'label' has 2"),
        "one_class": (
            {**pets, "data_dir": str(tmp_path / "one_class")},
            r"feature 'label' has one class \(cat\); a classifier needs two$",
        ),
        "array_record": (
            {**pets, "data_dir": str(tmp_path / "array")},
            r"the shards are array_record, not tfrecord; only TFRecord shards are supported yet",
        ),
        "garbled": (
            {**pets, "data_dir": str(tmp_path / "garbled")},
            r"dataset_info\.json: not a readable TFDS dataset",
        ),
    }


BAD = [
    "no_folder",
    "no_info",
    "wrong_name",
    "version",
    "configs",
    "name_mismatch",
    "train_split",
    "val_split",
    "val_fraction",
    "image_key",
    "label_key",
    "not_class_label",
    "class_names",
    "one_class",
    "array_record",
    "garbled",
]


@pytest.mark.unit
@pytest.mark.parametrize("case", BAD)
def test_each_bad_input_is_one_data_error_line(data_dir, tmp_path, case):
    options, message = _bad_inputs(data_dir, tmp_path)[case]
    with pytest.raises(DataError, match=message) as raised:
        TFDSFiles(image_size=32, **options).load()
    assert "\n" not in str(raised.value)


@pytest.mark.unit
def test_without_tensorflow_datasets_the_part_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # `import tensorflow_datasets` then fails
    with pytest.raises(ConfigError, match=r'dataset=tfds needs tensorflow-datasets .*pip install -e "\.\[tfds\]"'):
        TFDSFiles(tfds_name="pets", data_dir=".", image_size=32).load()


@pytest.mark.unit
def test_the_network_guard_is_live_and_loading_never_touches_it(data_dir, no_network):
    with pytest.raises(NetworkUsed):
        socket.create_connection(("127.0.0.1", 9))
    assert len(no_network) == 1
    no_network.clear()
    TFDSFiles(tfds_name="pets", data_dir=str(data_dir), image_size=32).load()
    assert not no_network, "reading a prepared folder opened a connection"


@pytest.mark.slow
@pytest.mark.integration
def test_dataset_tfds_trains_end_to_end_offline(data_dir, tmp_path, no_network):
    """`python run.py dataset=tfds dataset.data_dir=DIR dataset.tfds_name=pets` in process, the socket blocked:
    the run trains, evaluates and records the counts; `mode=predict` on the run is not needed for TFDS."""
    import json

    from conftest import compose
    from trainer.tasks import run_task

    overrides = ["dataset=tfds", f"dataset.data_dir={data_dir}", "dataset.tfds_name=pets", "dataset.image_size=32",
                 "debug=smoke", "trainer.batch_size=4"]  # fmt: skip
    run_task(compose(overrides, tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_examples"] == {"train": 12, "val": 4, "test": 4} and not no_network


@pytest.mark.integration
@pytest.mark.slow
def test_the_folds_of_a_tfds_folder_partition_train_and_val(data_dir):
    from trainer.data.folds import fold_splits

    splits = TFDSFiles(tfds_name="pets", data_dir=str(data_dir), image_size=32).load()

    def pixels(source) -> list[bytes]:
        batches = eval_dataset(source, splits.decoder, Preprocess(32), 8)
        return sorted(image.tobytes() for images, _ in batches for image in images.numpy())

    pool = sorted(pixels(splits.sources["train"]) + pixels(splits.sources["val"]))
    vals = []
    for fold in (0, 1):
        folded = fold_splits(splits, 2, fold, seed=0)
        assert sorted(pixels(folded.sources["train"]) + pixels(folded.sources["val"])) == pool
        labels = _labels_follow_colours(eval_dataset(folded.sources["val"], splits.decoder, Preprocess(32), 8), CLASSES)
        assert sorted(labels) == [0] * 4 + [1] * 4, "stratified: each class halved"
        vals += pixels(folded.sources["val"])
    assert sorted(vals) == pool
