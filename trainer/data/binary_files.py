"""`dataset=cifar`, `dataset=digits`: fixed-length binary record files (`trainer.data.binary`) as a dataset part.

python run.py dataset=cifar dataset.data_dir=/data/cifar10
"""

from __future__ import annotations

import logging

from trainer.data import binary, pipeline
from trainer.data.decoders import BinaryDecoder
from trainer.data.parts import Splits
from trainer.data.predict_inputs import record_chunks
from trainer.data.shares import Records
from trainer.data.sources import FixedLengthReader, Source

log = logging.getLogger(__name__)


def check_labels(paths: list, decoder: BinaryDecoder) -> None:
    """Every record's label, by the decoder's rule, read once at start-up.

    Raises:
        DataError: a file is not a whole number of records, or `FILE: record N has label L, expected ...`.
    """
    counts = [binary.records_by_size(path, decoder.layout) for path in paths]
    source = Source(
        Records.whole_files([str(path) for path in paths], sum(counts)), FixedLengthReader(decoder.layout.record_bytes)
    )
    pipeline.refuse_bad(source, decoder.label_reasons)


class BinaryFiles:
    """`dataset=cifar`, `dataset=digits`: fixed-length binary record files, as a dataset part
    (`trainer.data.parts`). The validation split is the last `val_size` training records, or the test files."""

    def __init__(
        self,
        data_dir: str,
        train_files: list[str],
        test_files: list[str],
        num_classes: int,
        class_names: list[str],
        height: int,
        width: int,
        channels: int,
        label_bytes: int = 1,
        label_index: int = 0,
        val_size: float = 5000,
        val_source: str = "train",
        search_subdirs: list[str] = (),
        download: bool = False,
        url: str | None = None,
        md5: str | None = None,
        name: str = "",
        image_size: int = 0,
    ) -> None:
        self.data_dir, self.names = data_dir, (list(train_files), list(test_files))
        self.num_classes, self.class_names, self.name = num_classes, list(class_names), name
        self.layout = binary.BinaryLayout(height, width, channels, label_bytes, label_index)
        self.val_size, self.val_source, self.search_subdirs = val_size, str(val_source), list(search_subdirs)
        self.url, self.md5 = (url if download else None), md5

    def load(self, check_val: bool = True) -> Splits:
        """Finds (or downloads) and checks the record files and splits them; without `check_val` (the caller
        never reads the validation split) an unfitting `dataset.val_size` is no error."""
        train_names, test_names = self.names
        paths = binary.locate(self.data_dir, train_names + test_names, self.search_subdirs, self.url, self.md5)
        train_paths, test_paths = paths[: len(train_names)], paths[len(train_names) :]
        splits = binary.make_splits(
            train_paths, test_paths, self.layout, self.num_classes, self.val_size, self.val_source, check_val
        )
        log.info(
            "Dataset %s from %s: %s records <dataset=%s>",
            self.name,
            paths[0].parent,
            {name: split.count for name, split in splits.items()},
            self.name,
        )
        layout = self.layout
        decoder = BinaryDecoder(layout, self.num_classes)
        check_labels(train_paths + test_paths, decoder)
        reader = FixedLengthReader(self.layout.record_bytes)
        return Splits(
            {name: Source(split, reader) for name, split in splits.items()},
            decoder,
            self.class_names,
            lambda: (
                [str(path) for path in train_paths],
                [binary.records_by_size(path, layout) for path in train_paths],
            ),
        )

    def predict_chunks(self, kind: str, files: list, preprocess, num_classes: int, batch_size: int):
        """`mode=predict` on `.bin` files of this layout."""
        if kind != "records":
            return None
        return record_chunks(files, self.layout, preprocess, num_classes, batch_size)
