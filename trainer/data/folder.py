"""`dataset=folder`: reads class sub-folders of JPEG, PNG, GIF, BMP or WebP files (keys: `trainer.data.formats.folder`).

    python run.py dataset=folder dataset.data_dir=photos/                            # photos/{train,val,test}/<class>/
    python run.py dataset=folder dataset.data_dir=PetImages/ dataset.val_fraction=0.1 dataset.test_fraction=0.1

Either `DIR/train/<class>/`, `DIR/val/<class>/` (and `DIR/test/<class>/`), or one
`DIR/<class>/` tree split per class by `dataset.val_fraction` and `dataset.test_fraction`
with `dataset.split_seed` (the converter's split). The file list is made once at start-up,
and every file is decoded once there, in tf.data, by the one decode (`trainer.data.decode`):
a file that gives no image is left out, named in the log and counted in `metrics.json`,
so no epoch ever meets it. With a disk cache (`trainer.data.cache`) the pixels of that
decode are the cache's entries: the first epoch reads them, no photo is decoded twice. The
list (relative path, size, label per file) is the run's record of what it trained on and
the fingerprint a resume checks (`RUN/data.json`).

A folder's record is its label, as `LABEL_DIGITS` digits, followed by the file's bytes:
image and label travel as one element from the read to the decode, and each worker's share
is whole files.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer import quiet
from trainer.data import cache as data_cache
from trainer.data.decode import decode_images
from trainer.data.images import decode_files
from trainer.data.parts import Splits, two_classes, val_split_name
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.data.verdicts import Verdicts
from trainer.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
LABEL_DIGITS = 8  # a record: the label as 8 digits, then the file's bytes
_TO_END = 2**31 - 1  # a substring length past any record's end


def stratified_split(
    items: list[tuple[Path, int]], val_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[tuple[Path, int]]]:
    """Splits per class (each split keeps the class balance), then shuffles each split with `seed`; the
    converter splits the same way."""
    rng = random.Random(seed)
    splits = {name: [] for name in SPLITS}
    for label in sorted({label for _, label in items}):
        members = [item for item in items if item[1] == label]
        rng.shuffle(members)
        num_val = round(len(members) * val_fraction)
        num_test = round(len(members) * test_fraction)
        splits["val"] += members[:num_val]
        splits["test"] += members[num_val : num_val + num_test]
        splits["train"] += members[num_val + num_test :]
    for members in splits.values():
        rng.shuffle(members)
    return splits


def walk_files(folder: Path) -> list[Path]:
    """Every file below `folder` (through symlinked folders), sorted.

    Raises:
        DataError: a symlinked folder leads back to a folder above it (a loop).
    """
    files = []
    for top, folders, names in os.walk(folder, followlinks=True):
        for name in folders:
            path = Path(top) / name
            if path.is_symlink() and Path(top).resolve().is_relative_to(path.resolve()):
                raise DataError(f"{path}: a symlink loop (it leads back to {path.resolve()}); remove the link")
        files += [Path(top) / name for name in names]
    return sorted(files)


def _class_folders(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir() if path.is_dir() and not path.name.startswith("."))


@dataclass(frozen=True)
class LabeledFileReader:
    """Reads image files as records: each range's path is the label's `LABEL_DIGITS` digits and then the file's
    path; the record is those digits and then the file's bytes (`trainer.data.sources.Reader`)."""

    parallel: bool = True  # many files: read several at once in training

    @staticmethod
    def record(entry: tf.Tensor) -> tf.Tensor:
        data = tf.io.read_file(tf.strings.substr(entry, LABEL_DIGITS, _TO_END))
        return tf.strings.join([tf.strings.substr(entry, 0, LABEL_DIGITS), data])

    def read(self, path, start, length):
        return tf.data.Dataset.from_tensors(self.record(path)).skip(start).take(length)


@dataclass(frozen=True)
class FileDecoder:
    """A batch of `LabeledFileReader` records -> (uint8 images [n, size, size, 3], int32 labels), each image
    through the one decode."""

    size: int
    resize_mode: str = "resize"

    @staticmethod
    def labels(records: tf.Tensor) -> tf.Tensor:
        """The labels of a batch of records alone, no image decoded (k-fold's stratification)."""
        return tf.strings.to_number(tf.strings.substr(records, 0, LABEL_DIGITS), tf.int32)

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        labels = self.labels(records)
        images = decode_images(tf.strings.substr(records, LABEL_DIGITS, _TO_END), self.size, self.resize_mode)
        return images, labels


class FolderLoader:
    """Lists and checks the class folders `keys` (`trainer.data.formats.folder.ImageFolder`) names."""

    def __init__(self, keys) -> None:
        self.root, self.size, self.name = Path(os.path.expanduser(str(keys.data_dir))), keys.image_size, keys.name
        self.class_names = list(keys.class_names) if keys.class_names else None
        self.fractions, self.split_seed = (keys.val_fraction, keys.test_fraction), keys.split_seed
        self.resize_mode = str(keys.resize_mode)
        self.cache, self.folds = (str(keys.cache), keys.cache_memory_mb, keys.cache_dir), keys.folds

    # --- which files -------------------------------------------------------------------------------------------

    def _classes(self, folder: Path) -> list[str]:
        found = _class_folders(folder)
        if not found:
            raise DataError(
                f"dataset.data_dir={self.root}: {folder} holds no class folders; expected "
                f"{self.root}/<class>/ or {self.root}/train/<class>/ holding the images"
            )
        names = self.class_names or found
        two_classes(names, lambda one: f"dataset.data_dir={self.root}: one class folder ({one}/)")
        unknown = [name for name in found if name not in names]
        missing = [name for name in names if name not in found]
        if unknown or missing:
            raise DataError(
                f"dataset.class_names={names} does not match the class folders of {folder} ({found}): "
                f"{'no folder ' + ', '.join(missing) if missing else 'folders ' + ', '.join(unknown) + ' not listed'}"
            )
        return names

    def _members(self, folder: Path, names: list[str]) -> list[tuple[Path, int]]:
        """(file, label) of every file in the class folders of `folder`; a class folder without files is refused,
        and so is a folder of a class that is not one of `names`."""
        unknown = [name for name in _class_folders(folder) if name not in names]
        if unknown:
            raise DataError(f"{folder / unknown[0]}: a class folder of no class of {self.root / 'train'} {names}")
        items = []
        for label, name in enumerate(names):
            files = walk_files(folder / name) if (folder / name).is_dir() else []
            if not files and folder.name != "test":
                raise DataError(f"{folder / name}: holds no image files; every class needs images")
            items += [(path, label) for path in files]
        return items

    def _listing(self) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
        """(class names, {split: [(file, label)]}) as the folder lays them out."""
        if not self.root.is_dir():
            raise DataError(f"dataset.data_dir={self.root}: no such folder")
        val_fraction, test_fraction = self.fractions
        if (self.root / "train").is_dir():
            names = self._classes(self.root / "train")
            val = val_split_name(_class_folders(self.root), str(self.root))  # val/, validation/ or valid/
            folders = {"train": "train", "val": val, "test": "test"}
            present = [split for split in SPLITS if folders[split] and (self.root / folders[split]).is_dir()]
            splits = {split: self._members(self.root / folders[split], names) for split in present}
            if "val" not in splits:
                if not val_fraction:
                    raise DataError(
                        f"dataset.data_dir={self.root} has train/ but no val/ (nor validation/, valid/): add "
                        f"{self.root}/val/<class>/, or set dataset.val_fraction to hold out a share of train/"
                    )
                carved = stratified_split(splits["train"], val_fraction, 0.0, self.split_seed)
                splits["train"], splits["val"] = carved["train"], carved["val"]
        else:
            names = self._classes(self.root)
            if not val_fraction:
                raise DataError(
                    f"dataset.data_dir={self.root} is one <class>/ tree: set dataset.val_fraction (and "
                    f"dataset.test_fraction) to split it, or lay it out as train/, val/ and test/"
                )
            splits = stratified_split(self._members(self.root, names), val_fraction, test_fraction, self.split_seed)
        if not splits.get("test"):
            log.warning("dataset.data_dir=%s has no test split: the test split is the validation split", self.root)
            splits["test"] = splits["val"]
        return names, splits

    # --- checked once ------------------------------------------------------------------------------------------

    def _checked(self, members: list[tuple[Path, int]], skipped: list[dict], keep: str) -> tuple[list, object]:
        """(the members whose file decodes, their pixels as the cache `keep` (disk, memory) holds them when all were
        decoded now, else None): on disk saved (`cache.save_decoded`), in memory a list of batches. The others go
        to `skipped` with their reason. A file whose verdict an earlier run kept, unchanged since (size,
        modification time), is not decoded again (`verdicts`)."""
        store = Verdicts(self.root, self.size, self.resize_mode)
        kept, reasons, unknown = store.read(), {}, []
        for index, (path, _) in enumerate(members):
            found, reason = store.known(kept, path)
            if found:
                reasons[index] = reason
            else:
                unknown.append(index)

        def decoded():  # (images, labels) of the files that decode, each run's reasons noted on the way
            paths = [str(members[index][0]) for index in unknown]
            for run in decode_files(paths, self.size, self.resize_mode, batch_size=256):
                for offset, error in enumerate(run.errors, start=run.start):
                    reasons[unknown[offset]] = error
                labels = [members[unknown[at]][1] for at, error in enumerate(run.errors, run.start) if error is None]
                if run.images is not None:
                    yield run.images, np.array(labels, np.int32)

        pixels = None
        with quiet.image_library_messages():  # each bad file is one skip line, not libjpeg's raw ones too
            if keep == "disk" and len(unknown) == len(members):  # every photo decoded now: the cache's pixels
                pixels = data_cache.save_decoded(decoded(), self.size, self.cache[2])
            elif keep == "memory" and len(unknown) == len(members):
                pixels = list(decoded())
            else:
                collections.deque(decoded(), maxlen=0)
        if unknown:
            store.write(kept, {members[index][0]: reasons[index] for index in unknown})
        good = []
        for index, member in enumerate(members):
            if reasons[index] is None:
                good.append(member)
            else:
                skipped.append({"file": self._shown(member[0]), "reason": reasons[index]})
        return good, pixels

    def load(self, check_val: bool = True, reads: tuple[str, ...] = SPLITS) -> Splits:
        """The splits, each file of those in `reads` decoded once (the caller reads no other split: `mode=evaluate
        evaluate.split=test` decodes no training image; the others are listed, unchecked)."""
        names, splits = self._listing()
        started, skipped, checked, done, staged = time.monotonic(), [], {}, {}, {}
        read = {split for split, members in splits.items() if any(splits.get(other) is members for other in reads)}
        keep = self._cached(splits)
        for split, members in splits.items():  # the test split standing in for val is the same list: checked once
            if split in read and id(members) not in done:  # in memory train and val are kept, on disk test too
                cached = keep == "disk" or (keep == "memory" and split != "test")
                done[id(members)], staged[split] = self._checked(members, skipped, keep if cached else "off")
            checked[split] = done.get(id(members), members)
        for entry in skipped:
            log.warning("Skipped %s: %s <dataset.data_dir=%s>", entry["file"], entry["reason"], self.root)
        try:
            for split in ("train", "val"):
                if split in read and not checked[split]:
                    raise DataError(f"dataset.data_dir={self.root}: no file of the {split} split gives an image")
            if "train" in read:
                self._every_class_trains(names, splits["train"], checked["train"], skipped)
        except DataError:
            self._publish(staged, {}, {}, "off")  # a refused folder: none of its pixels kept
            raise
        log.info(
            "Dataset %s from %s: %s images of %d classes %s, every file of %s decoded in %.1f s (%d left out) "
            "<dataset=%s>",
            self.name,
            self.root,
            {split: len(members) for split, members in checked.items()},
            len(names),
            names,
            "/".join(split for split in splits if split in read) or "no split",
            time.monotonic() - started,
            len(skipped),
            self.name,
        )
        records = {split: self._records(members) for split, members in checked.items()}
        listed = {split: self._listed(members) for split, members in sorted(checked.items())}
        fingerprint = {split: part for split, (part, _) in listed.items()}
        stamp = hashlib.sha256(json.dumps({split: times for split, (_, times) in listed.items()}).encode()).hexdigest()
        self._publish(staged, records, fingerprint, self._cached(checked), stamp)
        reader = LabeledFileReader()
        return Splits(
            {split: Source(part, reader) for split, part in records.items()},
            FileDecoder(self.size, self.resize_mode),
            names,
            lambda: (list(records["train"].files), [1] * records["train"].count),
            {
                split: {name: sum(label == index for _, label in members) for index, name in enumerate(names)}
                for split, members in checked.items()
            },
            fingerprint=fingerprint,
            skipped=skipped,
            resize_mode=self.resize_mode,
            files=[str(path) for members in checked.values() for path, _ in members],
            photos=True,
            stamp=stamp,
        )

    # --- the check's pixels, the first epoch's cache --------------------------------------------------------

    def _cached(self, splits: dict[str, list]) -> str:
        """Where the pipeline keeps these splits' decoded images: disk, memory or off (`DataModule.build` decides
        alike; k-fold's splits are others)."""
        image_bytes = data_cache.decoded_bytes(len(splits["train"]) + len(splits["val"]), self.size)
        return "off" if self.folds else data_cache.resolved(self.cache[0], True, image_bytes, self.cache[1])

    def _publish(
        self, staged: dict[str, object], records: dict[str, Records], fingerprint: dict, keep: str, stamp: str = ""
    ) -> None:
        """Hands each split's pixels the check kept to the cache that keys them so (the data's fingerprint, the
        image size and resize mode, the decode's version): the first epoch reads them. Fewer photos decode than
        were listed: they may fit in memory after all, and what was saved on disk is dropped."""
        identity = data_cache.identity_of(fingerprint, self.size, self.resize_mode, stamp)
        cache, held = data_cache.Cache(keep, self.cache[2], identity), {}
        for split, pixels in staged.items():
            if isinstance(pixels, Path) and keep == "disk":
                cache.publish(pixels, records[split].ranges, records[split].count)
            elif isinstance(pixels, Path):
                shutil.rmtree(pixels, ignore_errors=True)
            elif pixels is not None and keep == "memory":
                held[data_cache.key_name(cache.key(records[split].ranges))] = pixels
        data_cache.hold(held)  # what an earlier load held goes

    def _every_class_trains(
        self, names: list[str], listed: list[tuple[Path, int]], good: list[tuple[Path, int]], skipped: list[dict]
    ) -> None:
        """Refuses a class of which no training file gives an image (a folder of `Thumbs.db` and `._x.jpg`): the
        folder check before the decode counts such files, and the class would train with no example.

        Raises:
            DataError: naming the first such class and the files of it that were skipped.
        """
        trained = {label for _, label in good}
        reasons = {entry["file"]: entry["reason"] for entry in skipped}
        for label, name in enumerate(names):
            if label in trained:
                continue
            files = [self._shown(path) for path, member in listed if member == label]
            if not files:
                raise DataError(
                    f"dataset.data_dir={self.root}: class {name!r} has no file in the train split (its few files "
                    f"all went to val and test: lower dataset.val_fraction and dataset.test_fraction, or add images)"
                )
            shown = "; ".join(f"{file}: {reasons[file]}" for file in files[:3] if file in reasons)
            more = f" and {len(files) - 3} more" if len(files) > 3 else ""
            raise DataError(
                f"dataset.data_dir={self.root}: class {name!r} has no training image: "
                f"{len(files)} file(s) of it skipped ({shown}{more}); every class needs images in the train split"
            )

    def _shown(self, path: Path) -> str:
        """A file's path below the folder as text; bytes that are not UTF-8 become backslash escapes."""
        return os.fsencode(path.relative_to(self.root)).decode("utf-8", errors="backslashreplace")

    def _listed(self, members: list[tuple[Path, int]]) -> tuple[dict, list[int]]:
        """A split's fingerprint (its count and [relative path, size, label] per file: what a resume checks) and its
        files' modification times (what else keys the decoded-image cache: a photo rewritten at the same size)."""
        stats = [(path, label, path.stat()) for path, label in members]
        files = [[self._shown(path), status.st_size, label] for path, label, status in stats]
        return {"records": len(members), "files": files}, [status.st_mtime_ns for _, _, status in stats]

    @staticmethod
    def _records(members: list[tuple[Path, int]]) -> Records:
        entries = [f"{label:0{LABEL_DIGITS}d}".encode() + os.fsencode(path) for path, label in members]
        return Records.whole_files(entries, len(members))  # bytes: a file name that is not UTF-8 stays as it is
