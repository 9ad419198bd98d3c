"""Fixed-length binary records on disk (CIFAR, the bundled digits): find, download, check and split them.

One record is `label_bytes` label bytes followed by the pixels stored
channel-first (all of R, then all of G, then all of B), as in the CIFAR-10
and CIFAR-100 binary versions and in the bundled digits. Checking happens once
at start-up, in NumPy, so a bad file fails before any training starts:

    python run.py dataset=cifar dataset.data_dir=/data/cifar10
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainer.data.shares import Records, ranges_of
from trainer.errors import DataError


@dataclass(frozen=True)
class BinaryLayout:
    """Layout of one fixed-length record: label bytes, then the pixels channel-first."""

    height: int
    width: int
    channels: int
    label_bytes: int = 1
    label_index: int = 0

    @property
    def image_bytes(self) -> int:
        return self.height * self.width * self.channels

    @property
    def record_bytes(self) -> int:
        return self.label_bytes + self.image_bytes


def find_files(data_dir: str | os.PathLike, names: list[str], search_subdirs: list[str]) -> list[Path] | None:
    """Returns the paths of `names` in the first folder that holds all of them, else None.

    The folders tried are `data_dir`, then each of `search_subdirs` below it, then
    the same below any `*_extracted` folder that `keras.utils.get_file` made.
    """
    root = Path(data_dir)
    candidates = [root] + [root / sub for sub in search_subdirs]
    for extracted in sorted(root.glob("*_extracted")):
        candidates += [extracted] + [extracted / sub for sub in search_subdirs]
    for folder in candidates:
        paths = [folder / name for name in names]
        if all(path.is_file() for path in paths):
            return paths
    return None


def download(url: str, md5: str | None, data_dir: str | os.PathLike) -> None:
    """Fetches and extracts the archive at `url` into `data_dir`, verifying its MD5.

    Raises:
        DataError: the download failed or the checksum does not match.
    """
    import keras  # deferred: importing Keras costs seconds

    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    fname = os.path.basename(url.split("?")[0]) or "archive.tar.gz"
    try:
        keras.utils.get_file(
            fname=fname,
            origin=url,
            file_hash=md5,
            hash_algorithm="md5",
            extract=True,
            cache_dir=str(root),
            cache_subdir=str(root),
        )
    except ValueError as error:
        (root / fname).unlink(missing_ok=True)  # never reuse a corrupt archive
        raise DataError(f"download of {url} failed its md5 check (expected {md5}): {error}") from None
    except Exception as error:
        raise DataError(f"download of {url} failed: {str(error).splitlines()[0]}") from None


def locate(
    data_dir: str,
    names: list[str],
    search_subdirs: list[str],
    url: str | None = None,
    md5: str | None = None,
) -> list[Path]:
    """Finds the record files, downloading them first when `url` is given and they are missing.

    Raises:
        DataError: the files are not there (the message lists them and where they were expected).
    """
    paths = find_files(data_dir, names, search_subdirs)
    if paths is None and url:
        try:
            download(url, md5, data_dir)
        except DataError as error:  # no internet, a proxy: the files can be put there by hand
            raise DataError(
                f"{error}. Without internet, download {url} on another machine, extract it and put "
                f"{', '.join(names)} in {Path(data_dir).resolve()} (or its {'/, '.join(search_subdirs) or '.'}/)"
            ) from None
        paths = find_files(data_dir, names, search_subdirs)
    if paths is None:
        where = ", ".join(str(Path(data_dir) / sub) for sub in ["", *search_subdirs])
        hint = "" if url else " (set dataset.download=true to fetch them)"
        raise DataError(f"dataset files {', '.join(names)} not found in {where}{hint}")
    return paths


def records_by_size(path: str | os.PathLike, layout: BinaryLayout) -> int:
    """Number of records in one file, checking that its size is a whole number of records."""
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"{path}: the file is empty, expected {layout.record_bytes}-byte records")
    if size % layout.record_bytes:
        raise DataError(
            f"{path}: {size} bytes is not a whole number of {layout.record_bytes}-byte records "
            f"({layout.label_bytes} label + {layout.height}x{layout.width}x{layout.channels} pixels)"
        )
    return size // layout.record_bytes


def make_splits(
    train_paths: list[Path],
    test_paths: list[Path],
    layout: BinaryLayout,
    num_classes: int,
    val_size: float,
    val_source: str,
    check_val: bool = True,
) -> dict[str, Records]:
    """Checks every file and returns the records of the train, val and test splits.

    With `val_source="train"` the last `val_size` training records are held
    out for validation (a `val_size` below 1 is a fraction of them); with
    `"test"` the test files double as validation. Without `check_val` (a mode
    that never reads the validation split) a `val_size` the files cannot hold
    is not an error: the test files stand in for validation.

    Raises:
        DataError: a file is not a whole number of records, or the training files hold too few records.
    """
    train_files = [str(path) for path in train_paths]
    train_counts = [records_by_size(path, layout) for path in train_paths]
    num_train = sum(train_counts)
    test = Records.whole_files([str(path) for path in test_paths], sum(records_by_size(p, layout) for p in test_paths))
    if 0 < val_size < 1:
        val_size = max(1, round(val_size * num_train))
    val_size = int(val_size)
    whole = Records.whole_files(train_files, num_train)
    if val_source == "test" or (not check_val and not 0 < val_size < num_train):
        return {"train": whole, "val": test, "test": test}
    if not 0 < val_size < num_train:
        raise DataError(
            f"dataset.val_size={val_size} must be between 1 and the {num_train} training records "
            f"in {', '.join(train_files)}"
        )
    held_out = num_train - val_size
    return {
        "train": Records(ranges_of(train_files, train_counts, 0, held_out), held_out),
        "val": Records(ranges_of(train_files, train_counts, held_out, num_train), val_size),
        "test": test,
    }
