"""`dataset=cifar`, `dataset=digits`: fixed-length binary record files (`trainer.data.binary`).

python run.py dataset=cifar dataset.data_dir=/data/cifar10
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainer.data.formats.base import LabeledFilesConfig
from trainer.fields import MISSING, choice, chosen, require

if TYPE_CHECKING:  # TensorFlow starts only when a format loads
    from trainer.data.parts import Splits

log = logging.getLogger(__name__)

ValSource = choice("ValSource", "train", "test")
Channels = choice("Channels", "1", "3")  # a field holds the member while Hydra composes, its number once checked


def check_labels(paths: list, decoder) -> None:
    """Every record's label, by the decoder's rule (`trainer.data.decoders.BinaryDecoder`), read once at start-up.

    Raises:
        DataError: a file is not a whole number of records, or `FILE: record N has label L, expected ...`.
    """
    from trainer.data import binary
    from trainer.data.shares import Records
    from trainer.data.sources import FixedLengthReader, Source

    counts = [binary.records_by_size(path, decoder.layout) for path in paths]
    records = Records.whole_files([str(path) for path in paths], sum(counts))
    check_sources([Source(records, FixedLengthReader(decoder.layout.record_bytes))], decoder)


def check_sources(sources: list, decoder) -> None:
    """Every record's label of each of `sources` (the splits a mode reads), in order.

    Raises:
        DataError: `FILE: record N has label L, expected ...` for the first bad one.
    """
    from trainer.data import pipeline

    for source in sources:
        pipeline.refuse_bad(source, decoder.label_reasons)


@dataclass
class BinaryFiles(LabeledFilesConfig):
    """Label bytes, then the pixels channel-first (CIFAR, the bundled digits). The validation split is the last
    `val_size` training records, or the test files."""

    _target_: str = "trainer.data.formats.binary.BinaryFiles"  # the dataset part

    search_subdirs: list[str] = field(default_factory=list)  # also look in these folders below data_dir
    height: int = MISSING  # stored image height
    width: int = MISSING  # stored image width
    channels: Channels = MISSING  # 1 or 3
    label_bytes: int = 1  # bytes before the pixels (CIFAR-100: 2, coarse then fine)
    label_index: int = 0  # which of those bytes is the label
    shuffle_buffer: int = 10000
    val_size: float = 5000  # validation records held out from the end of the training files; < 1: a fraction
    val_source: ValSource = ValSource.train  # train: hold out val_size records; test: validate on the test files
    download: bool = False  # fetch `url` if the files are missing
    url: str | None = None  # the archive fetched when dataset.download=true and the files are missing
    md5: str | None = None  # checksum of the archive at `url`

    def __post_init__(self) -> None:
        super().__post_init__()
        self.channels = int(chosen(Channels, self.channels, "dataset.channels"))  # the part takes the number
        for key in ("height", "width", "label_bytes"):
            require(getattr(self, key) >= 1, f"dataset.{key}", ">= 1", getattr(self, key))
        require(self.num_classes <= 256, "dataset.num_classes", "<= 256 (one label byte)", self.num_classes)
        require(
            0 <= self.label_index < self.label_bytes, "dataset.label_index", "in [0, label_bytes)", self.label_index
        )
        self.augment.check_fits(self.resize_to)
        require(
            self.val_size >= 0 and (self.val_size < 1 or float(self.val_size).is_integer()),
            "dataset.val_size",
            "a record count or a fraction in (0, 1)",
            self.val_size,
        )
        if self.val_size >= 1:
            self.val_size = int(self.val_size)
        if self.download:
            require(bool(self.url), "dataset.url", "set when dataset.download=true", self.url)

    @property
    def resize_to(self) -> int:
        return self.image_size or self.height

    @property
    def layout(self):
        """The record layout (`trainer.data.binary.BinaryLayout`)."""
        from trainer.data.binary import BinaryLayout

        return BinaryLayout(self.height, self.width, self.channels, self.label_bytes, self.label_index)

    def load(self, check_val: bool = True, reads: tuple[str, ...] = ("train", "val", "test")) -> Splits:
        """Finds (or downloads) and checks the record files and splits them; without `check_val` (the caller
        never reads the validation split) an unfitting `dataset.val_size` is no error. Every record's label of
        the splits in `reads` (the caller reads no other: `mode=evaluate` reads test) is checked by `Splits.check`
        (`trainer.data.module.DataModule.check_records`)."""
        from trainer.data import binary
        from trainer.data.decoders import BinaryDecoder
        from trainer.data.parts import Splits
        from trainer.data.sources import FixedLengthReader, Source

        names = (list(self.train_files), list(self.test_files))
        url = self.url if self.download else None
        paths = binary.locate(self.data_dir, names[0] + names[1], list(self.search_subdirs), url, self.md5)
        train_paths, test_paths = paths[: len(names[0])], paths[len(names[0]) :]
        layout, val_source = self.layout, str(self.val_source)
        splits = binary.make_splits(
            train_paths, test_paths, layout, self.num_classes, self.val_size, val_source, check_val
        )
        counts = {name: split.count for name, split in splits.items()}
        log.info("Dataset %s from %s: %s records <dataset=%s>", self.name, paths[0].parent, counts, self.name)
        decoder = BinaryDecoder(layout, self.num_classes)
        reader = FixedLengthReader(layout.record_bytes)
        sources = {name: Source(split, reader) for name, split in splits.items()}
        read = {id(splits[name]): sources[name] for name in reads}  # val_source=test: val is the test records
        check = functools.partial(check_sources, list(read.values()), decoder)
        return Splits(
            sources,
            decoder,
            list(self.class_names),
            lambda: (
                [str(path) for path in train_paths],
                [binary.records_by_size(path, layout) for path in train_paths],
            ),
            find_bad_record=lambda error: check(),  # a bad label met in a pipeline: the check's own line
            check=check,  # DataModule.check_records runs it
        )

    def predict_chunks(self, kind: str, files: list, preprocess, num_classes: int, batch_size: int):
        """`mode=predict` on `.bin` files of this layout."""
        from trainer.data.predict_inputs import record_chunks

        return record_chunks(files, self.layout, preprocess, num_classes, batch_size) if kind == "records" else None
