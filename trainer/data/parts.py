"""A dataset is a part, built from `dataset._target_` like the model: what every format answers.

    python run.py dataset=cifar                                   # trainer.data.formats.binary.BinaryFiles
    python run.py dataset=cats_dogs                               # trainer.data.formats.tfrecord.TFRecordFiles
    python run.py dataset=folder dataset.data_dir=photos/         # trainer.data.formats.folder.ImageFolder
    python run.py dataset=custom dataset._target_=my_package.MySource dataset.root=/data

A part is any class (or function) called with its keys of the `dataset` section and
`image_size` (the side the stored images are resized to), whose `load(check_val)` returns
`Splits`: each split's records (`trainer.data.sources.Source`), the batch decoder, the class
names, the train files for the worker shares, and optionally its fingerprint, the files it
left out and how it makes images square. The one pipeline (`trainer.data.pipeline`) does
the rest, for every part alike. `docs/extending.md` shows your own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from trainer.data.decoders import Decoder
from trainer.data.sources import Source
from trainer.errors import DataError


def two_classes(names: list[str], refusal: Callable[[str], str]) -> None:
    """The class rule of every format: a classifier needs two. `refusal(the one class)` says where.

    Raises:
        DataError: `names` holds fewer than two.
    """
    if len(names) < 2:
        raise DataError(f"{refusal(names[0] if names else 'none')}; a classifier needs two")


VAL_NAMES = ("val", "validation", "valid")  # the validation split's names in the wild: every format finds each


def val_split_name(present: Iterable[str], where: str, chosen: str = "validation") -> str | None:
    """The validation split among the split names `present` at `where`: `chosen` (`dataset.val_split`) when it
    is a name of its own, else whichever of `VAL_NAMES` is there; None without one.

    Raises:
        DataError: two of `VAL_NAMES` are there, and nothing says which validates.
    """
    present = list(present)
    if chosen not in VAL_NAMES:
        return chosen if chosen in present else None
    found = [name for name in VAL_NAMES if name in present]
    if len(found) > 1:
        raise DataError(
            f"{where}: both {found[0]!r} and {found[1]!r} look like the validation split; keep one (rename or move "
            f"the other), as it is not clear which one validates"
        )
    return found[0] if found else None


@dataclass(frozen=True)
class Splits:
    """What a dataset part found: each split's source, the decoder of its records, the class names."""

    sources: dict[str, Source]  # "train", "val", "test"
    decoder: Decoder  # a batch of records -> (uint8 images, int32 labels)
    class_names: list[str]
    train_files: Callable[[], tuple[list[str], list[int]]]  # every train file and its records (worker shares)
    class_counts: dict[str, dict[str, int]] | None = None  # per split, when known without reading the images
    find_bad_record: Callable[[Exception], None] | None = None  # names what the pipeline's error could not name
    fingerprint: dict | None = None  # what a resume checks; None: file names, sizes and sampled checksums
    skipped: list[dict] = field(default_factory=list)  # files left out, each {"file", "reason"}
    resize_mode: str = "resize"  # how encoded images are made square (`trainer.data.decode.RESIZE_MODES`)
    files: list[str] | None = None  # every file read, for the whole-file checksum ([]: none); None: the sources'
    photos: bool = False  # compressed images (JPEG, PNG): their decode is the cost `dataset.cache=auto` keeps
    check: Callable[[], None] | None = None  # a check of every record the part leaves to `DataModule.check_records`
    stamp: str | None = None  # what else keys the decoded-image cache: the files' modification times (a folder's)


class DatasetPart(Protocol):
    """What `dataset._target_` builds."""

    def load(self, check_val: bool = True) -> Splits:
        """Finds and checks the data; without `check_val` the caller never reads the validation split. A part
        whose check is costly may take `reads` too, the splits the caller reads (`ImageFolder` decodes only
        theirs): `load(check_val, reads=("test",))`. One that refuses bad data while loading may take `list_bad`:
        the data check's load, which lists what it finds instead (`TFRecordFiles`: a corrupted frame)."""

    def predict_chunks(self, kind: str, files: list, preprocess, num_classes: int, batch_size: int) -> Iterator:
        """Optional: `mode=predict` on record files of this format (`kind`: records | tfrecords)."""
