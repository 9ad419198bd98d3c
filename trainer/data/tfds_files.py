"""`dataset=tfds`: reads a prepared TensorFlow Datasets folder offline (keys: `trainer.data.formats.tfds`).

    python run.py dataset=tfds dataset.data_dir=~/tensorflow_datasets dataset.tfds_name=cats_vs_dogs \
        dataset.val_fraction=0.1                 # cats_vs_dogs has one split: hold out its last 10% for val
    python run.py dataset=tfds dataset.data_dir=~/tensorflow_datasets/beans/0.1.0 dataset.tfds_name=beans

`dataset.data_dir` is TFDS's data_dir (holding `NAME/[CONFIG/]VERSION/`), a folder below it,
or the version folder itself, the one holding `dataset_info.json`. It is read with
`tfds.builder_from_directory`, which never downloads: the splits, their shard files and
record counts, and the label's `ClassLabel` names come from `dataset_info.json`. The shards are
TFRecord files of `tf.train.Example`s keyed by feature name, the image feature holding the
encoded PNG or JPEG bytes and the label an int64, so they are read as any TFRecord part is
(`trainer.data.tfrecord_files`): the one decode, each worker's share whole shards or record
ranges. Needs tensorflow-datasets: pip install -e ".[tfds]".
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from google.protobuf import json_format

from trainer.data.decoders import TFRecordDecoder
from trainer.data.parts import Splits, two_classes, val_split_name
from trainer.data.shares import Records, ranges_of
from trainer.data.sources import Source, TFRecordReader
from trainer.data.tfrecord_files import broken_frame_finder
from trainer.data.tfrecords import RecordSpec
from trainer.errors import ConfigError, DataError

log = logging.getLogger(__name__)

INFO_FILE = "dataset_info.json"  # what marks a prepared version folder
DOWNLOADS = "downloads"  # TFDS's download cache in a data_dir, not a dataset
VERSION = re.compile(r"^\d+\.\d+\.\d+$")  # a version folder's name: 1.0.0


def _version_of(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


class TFDSLoader:
    """Reads the TFRecord shards of the prepared TFDS dataset `keys` (`trainer.data.formats.tfds.TFDSFiles`) names."""

    def __init__(self, keys) -> None:
        try:
            import tensorflow_datasets
        except ImportError as error:
            raise ConfigError(f'dataset=tfds needs tensorflow-datasets ({error}): pip install -e ".[tfds]"') from None
        self.tfds = tensorflow_datasets
        self.root = Path(os.path.expanduser(str(keys.data_dir)))
        self.tfds_name, self.version = keys.tfds_name, keys.version
        self.size, self.name = keys.image_size, keys.name
        self.keys = {"image": keys.image_key, "label": keys.label_key}
        self.split_names = {"train": keys.train_split, "val": keys.val_split, "test": keys.test_split}
        self.val_fraction = keys.val_fraction
        self.class_names = list(keys.class_names) if keys.class_names else None

    # --- which folder ------------------------------------------------------------------------------------------

    def version_dir(self) -> Path:
        """The prepared version folder: `data_dir` itself, else the one of `dataset.version` (None: the newest)
        below `data_dir/tfds_name/` or `data_dir/`, as `NAME/VERSION/` or `NAME/CONFIG/VERSION/`.

        Raises:
            DataError: no such folder, no version folder below it, several configs below it, or not the
                version asked for.
        """
        if not self.root.is_dir():
            raise DataError(f"dataset.data_dir={self.root}: no such folder")
        if (self.root / INFO_FILE).is_file():
            return self.root
        if (self.root / self.tfds_name).is_dir():
            base = self.root / self.tfds_name
        elif self.tfds_name in (self.root.name, self.root.parent.name):  # NAME/ or NAME/CONFIG/ itself
            base = self.root
        else:
            held = sorted(path.name for path in self.root.iterdir() if path.is_dir() and path.name != DOWNLOADS)
            raise DataError(
                f"dataset.data_dir={self.root}: no folder {self.tfds_name}/ (dataset.tfds_name) and no {INFO_FILE}; "
                f"it holds {held}"
            )
        found = [
            path.parent
            for pattern in (f"*/{INFO_FILE}", f"*/*/{INFO_FILE}")
            for path in base.glob(pattern)
            if VERSION.match(path.parent.name)
        ]
        if not found:
            raise DataError(
                f"dataset.data_dir={self.root}: no {INFO_FILE} in {base}/VERSION/ or {base}/CONFIG/VERSION/; expected "
                f"a prepared TFDS folder (DATA_DIR/{self.tfds_name}/1.0.0/{INFO_FILE})"
            )
        configs = sorted({folder.parent for folder in found})
        if len(configs) > 1:
            raise DataError(
                f"dataset.data_dir={self.root}: {base} holds several configs ({', '.join(c.name for c in configs)}); "
                f"set dataset.data_dir to {base}/CONFIG"
            )
        versions = sorted((folder for folder in found), key=lambda folder: _version_of(folder.name))
        if self.version is None:
            return versions[-1]
        chosen = [folder for folder in versions if folder.name == str(self.version)]
        if not chosen:
            raise DataError(
                f"dataset.version={self.version}: not in {configs[0]}, which holds versions "
                f"{[folder.name for folder in versions]}"
            )
        return chosen[0]

    # --- what it holds -----------------------------------------------------------------------------------------

    def _info(self, folder: Path):
        """`builder.info` of the version folder, read offline, checked to be TFRecord shards."""
        try:
            info = self.tfds.builder_from_directory(str(folder)).info
        except (OSError, ValueError, KeyError, json_format.ParseError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(f"{folder / INFO_FILE}: not a readable TFDS dataset ({reason})") from None
        if self.tfds_name and info.name != self.tfds_name:
            raise DataError(f"{folder}: holds the TFDS dataset {info.name!r}, not dataset.tfds_name={self.tfds_name!r}")
        file_format = getattr(info.file_format, "value", info.file_format)
        if file_format != "tfrecord":
            raise DataError(
                f"{folder}: the shards are {file_format}, not tfrecord; only TFRecord shards are supported yet "
                f"(prepare the dataset with file_format='tfrecord')"
            )
        return info

    def _classes(self, folder: Path, info) -> list[str]:
        """The class names: the label's `ClassLabel` names, or `dataset.class_names`."""
        features = info.features
        for kind, key in self.keys.items():
            if key not in features:
                raise DataError(f"{folder}: no feature '{key}' (dataset.{kind}_key); it has {sorted(features)}")
        image = features[self.keys["image"]]
        if not isinstance(image, self.tfds.features.Image):
            raise DataError(
                f"{folder}: feature '{self.keys['image']}' (dataset.image_key) is a {type(image).__name__}, "
                f"expected an Image feature (encoded PNG or JPEG)"
            )
        label = features[self.keys["label"]]
        names = list(label.names) if isinstance(label, self.tfds.features.ClassLabel) else None
        if names is None and self.class_names is None:
            raise DataError(
                f"{folder}: feature '{self.keys['label']}' (dataset.label_key) is a {type(label).__name__}, not a "
                f"ClassLabel; dataset.class_names is needed to name its classes"
            )
        if names is not None and self.class_names is not None and len(self.class_names) != len(names):
            raise DataError(
                f"dataset.class_names={self.class_names} names {len(self.class_names)} classes but {folder}'s "
                f"ClassLabel '{self.keys['label']}' has {len(names)}: {names}"
            )
        names = self.class_names or names
        two_classes(names, lambda one: f"{folder}: feature '{self.keys['label']}' has one class ({one})")
        return names

    def _shards(self, folder: Path, info, split: str) -> tuple[list[str], list[int]]:
        """(shard files, records per shard) of a TFDS split; a listed shard that is missing is refused."""
        split_info = info.splits[split]
        files, counts = [str(path) for path in split_info.filepaths], list(split_info.shard_lengths)
        for path in files:
            if not os.path.exists(path):
                raise DataError(f"{path}: a shard of split '{split}' that {folder / INFO_FILE} lists is missing")
        if not sum(counts):
            raise DataError(f"{folder}: split '{split}' holds no records")
        return files, counts

    def _records(self, folder: Path, info, check_val: bool) -> tuple[dict[str, Records], list[str], list[int]]:
        """({split: records}, train shard files, their counts); val is the tail of train with `val_fraction`."""
        present = list(info.splits.keys())
        val = val_split_name(present, str(folder), self.split_names["val"])  # val, validation or valid
        self.split_names["val"] = val or self.split_names["val"]
        if self.split_names["train"] not in present:
            raise DataError(f"{folder}: no split '{self.split_names['train']}' (dataset.train_split); it has {present}")
        if self.split_names["val"] not in present and not self.val_fraction and check_val:
            raise DataError(
                f"{folder}: no split '{self.split_names['val']}' (dataset.val_split); it has {present}: name one "
                f"of them, or set dataset.val_fraction to hold out the last share of "
                f"'{self.split_names['train']}'"
            )
        train_files, train_counts = self._shards(folder, info, self.split_names["train"])
        total = sum(train_counts)
        records = {"train": Records.whole_files(train_files, total)}
        if self.split_names["val"] in present:
            records["val"] = Records.whole_files(*self._split(folder, info, "val"))
        elif self.val_fraction:
            held_out = round(total * self.val_fraction)
            if not 0 < held_out < total:
                raise DataError(
                    f"dataset.val_fraction={self.val_fraction} holds out {held_out} of the {total} records of split "
                    f"'{self.split_names['train']}'; it must leave at least one record on each side"
                )
            kept = total - held_out  # the tail: TFDS shuffled the records when it prepared them
            records["train"] = Records(ranges_of(train_files, train_counts, 0, kept), kept)
            records["val"] = Records(ranges_of(train_files, train_counts, kept, total), held_out)
        if self.split_names["test"] in present:
            records["test"] = Records.whole_files(*self._split(folder, info, "test"))
        else:
            log.warning("%s: no split '%s': the test split is the validation split", folder, self.split_names["test"])
        records.setdefault("val", records.get("test", records["train"]))  # check_val=False: val is never read
        records.setdefault("test", records["val"])
        return records, train_files, train_counts

    def _split(self, folder: Path, info, key: str) -> tuple[list[str], int]:
        files, counts = self._shards(folder, info, self.split_names[key])
        return files, sum(counts)

    def load(self, check_val: bool = True) -> Splits:
        folder = self.version_dir()
        info = self._info(folder)
        names = self._classes(folder, info)
        records, train_files, train_counts = self._records(folder, info, check_val)
        spec = RecordSpec.for_format("jpeg", self.size, "none", **self.keys)  # "jpeg": any encoded image
        log.info(
            "Dataset %s (TFDS %s, %d shards) from %s: %s records, classes %s <dataset.tfds_name=%s>",
            self.name,
            info.full_name,
            len({path for part in records.values() for path in part.files}),
            folder,
            {split: part.count for split, part in records.items()},
            names,
            self.tfds_name,
        )
        listed = {str(path): count for part in info.splits.values() for path, count in zip(
            part.filepaths, part.shard_lengths, strict=True)}  # fmt: skip
        reader = TFRecordReader("")
        return Splits(
            {split: Source(part, reader) for split, part in records.items()},
            TFRecordDecoder(spec, len(names)),
            names,
            lambda: (train_files, train_counts),
            find_bad_record=broken_frame_finder(
                {split: part.files for split, part in records.items()}, spec, shards=(str(folder / INFO_FILE), listed)
            ),
            photos=spec.format != "raw",
        )
