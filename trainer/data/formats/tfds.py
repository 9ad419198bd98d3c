"""`dataset=tfds`: a prepared TensorFlow Datasets folder, read offline (by `trainer.data.tfds_files`).

python run.py dataset=tfds dataset.data_dir=~/tensorflow_datasets dataset.tfds_name=beans
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.data.formats.base import PhotoConfig
from trainer.fields import MISSING, require

if TYPE_CHECKING:  # TensorFlow starts only when a format loads
    from trainer.data.parts import Splits


@dataclass
class TFDSFiles(PhotoConfig):
    """`DATA_DIR/NAME/[CONFIG/]VERSION/` with its dataset_info.json and TFRecord shards; never downloads.
    Without a validation split, `val_fraction` holds out the last share of the train split's records."""

    _target_: str = "trainer.data.formats.tfds.TFDSFiles"  # the dataset part
    name: str = "tfds"  # the option's name
    tfds_name: str = MISSING  # the TFDS dataset's name (cats_vs_dogs): DATA_DIR/NAME/[CONFIG/]VERSION/
    version: str | None = None  # the version folder to read (1.0.0); null: the newest found
    image_key: str = "image"  # the Image feature (encoded PNG or JPEG bytes)
    label_key: str = "label"  # the integer label feature (a ClassLabel names the classes; else class_names must)
    train_split: str = "train"  # TFDS split names
    val_split: str = "validation"  # val and valid are found too; missing: val_fraction holds out part of train
    test_split: str = "test"  # missing: the test split is the validation split

    def __post_init__(self) -> None:
        super().__post_init__()
        self.names("tfds_name", "image_key", "label_key", "train_split", "val_split", "test_split")
        if self.version is not None:
            parts = str(self.version).split(".")
            require(
                len(parts) == 3 and all(part.isdigit() for part in parts),
                "dataset.version",
                "a version folder's name such as 1.0.0, or null",
                self.version,
            )

    def load(self, check_val: bool = True) -> Splits:
        """Reads dataset_info.json and the shards' counts (`trainer.data.tfds_files`)."""
        from trainer.data.tfds_files import TFDSLoader

        return TFDSLoader(self).load(check_val)
