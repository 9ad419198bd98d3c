"""`dataset=cats_dogs`: TFRecord shards, the converter's or the classic files (read by `trainer.data.tfrecord_files`).

python -m trainer.convert PetImages/ records/ --image-size 64 --format jpeg
python run.py dataset=cats_dogs dataset.data_dir=records/      # 64-pixel JPEG records, from the manifest
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.data.formats.base import LabeledFilesConfig, ResizeMode
from trainer.fields import MISSING, choice, file_list, require

if TYPE_CHECKING:  # TensorFlow starts only when a format loads
    from trainer.data.parts import Splits

TFRecordFormat = choice("TFRecordFormat", "raw", "jpeg")
Compression = choice("Compression", "auto", "none", "gzip", "zlib")  # trainer.data.tfrecords.COMPRESSIONS


@dataclass
class TFRecordFiles(LabeledFilesConfig):
    """Each split its own files (globs). A converted folder is read as its `manifest.json` says; a key left unset
    (null) takes the manifest's, else the classic raw 224 layout of two classes, cat and dog."""

    _target_: str = "trainer.data.formats.tfrecord.TFRecordFiles"  # the dataset part

    data_dir: str = "."  # the converter's OUTPUT_DIR; the globs below usually start with it
    val_files: Any = MISSING  # a glob or a list of globs, for the validation split
    format: TFRecordFormat | None = None  # raw (label + img_raw pixels) | jpeg (image/encoded ...); null: the
    # converter's manifest.json, else raw
    stored_size: int | None = None  # raw: side of the stored images; null: the manifest's, else 224
    resize_mode: ResizeMode | None = None  # how the converter made images square; null: the manifest's, else resize
    image_key: str | None = None  # feature keys; null: the format's defaults
    label_key: str | None = None  # feature key of the integer label
    filename_key: str | None = None  # feature key of the stored file name (unlabeled records, predictions)
    compression: Compression = Compression.auto  # auto (from each file's first bytes) | none | gzip | zlib
    num_classes: int | None = None  # classes the labels index; null: the converter's manifest's, else 2
    class_names: list[str] | None = None  # in label order; null: the manifest's, else [cat, dog] (the manifest's win)
    image_size: int = 224  # stored images are resized to this side: the model input unless augment.crop crops

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, "dataset.image_size", ">= 1", self.image_size)
        if self.stored_size is not None:
            require(self.stored_size >= 1, "dataset.stored_size", ">= 1", self.stored_size)
        self.val_files = file_list(self.val_files, "dataset.val_files")
        self.augment.check_fits(self.resize_to)

    def load(self, check_val: bool = True, list_bad: bool = False) -> Splits:
        """Expands the globs, checks each file's first record and counts the records (the manifest's counts
        when it lists the same files); `list_bad`: a corrupted frame is left to the data check to list."""
        from trainer.data.tfrecord_files import TFRecordLoader

        return TFRecordLoader(self).load(list_bad)

    def predict_chunks(self, kind: str, files: list, preprocess, num_classes: int, batch_size: int):
        """`mode=predict` on TFRecord files of this layout (their own manifest's, when they have one)."""
        from trainer.data.tfrecord_files import TFRecordLoader

        if kind != "tfrecords":
            return None
        return TFRecordLoader(self).predict_chunks(files, preprocess, num_classes, batch_size)
