"""`dataset=parquet`: Parquet files or a Hugging Face `save_to_disk` folder (read by `trainer.data.parquet`).

python run.py dataset=parquet dataset.data_dir=beans/
python run.py dataset=parquet dataset.data_dir=cifar10/ dataset.image_column=img dataset.val_fraction=0.1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.data.formats.base import PhotoConfig, ResizeMode

if TYPE_CHECKING:  # TensorFlow starts only when a format loads
    from trainer.data.parts import Splits


@dataclass
class ArrowFiles(PhotoConfig):
    """Per split, `DIR/<split>.parquet`, `DIR/<split>-*.parquet`, `DIR/data/<split>-*.parquet` or
    `DIR/<split>/data-*.arrow`; string labels or a ClassLabel name the classes (else "0", "1", ...)."""

    _target_: str = "trainer.data.formats.parquet.ArrowFiles"  # the dataset part
    name: str = "parquet"  # the option's name
    image_column: str = "image"  # encoded image bytes, or the Image feature's {bytes, path} struct
    label_column: str = "label"  # integer labels (a ClassLabel's names become the class names)
    train_split: str = "train"  # split names: the files' prefix (train-00000-of-00002.parquet) or folder (train/)
    val_split: str = "validation"  # val and valid are found too; missing: val_fraction holds out a share of train
    test_split: str = "test"  # missing: the test split is the validation split
    resize_mode: ResizeMode = ResizeMode.resize  # resize (squash) | crop (centre square) | pad (onto black)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.names("image_column", "label_column", "train_split", "val_split", "test_split")

    def load(self, check_val: bool = True, reads: tuple[str, ...] = ("train", "val", "test")) -> Splits:
        """Reads the label columns once and checks those of the splits `reads` (`trainer.data.parquet`)."""
        from trainer.data.parquet import ArrowLoader

        return ArrowLoader(self).load(check_val, reads)

    def predict_chunks(self, kind: str, files: list, preprocess, num_classes: int, batch_size: int):
        """`mode=predict` on Parquet or Arrow stream files with these columns: each bad row gets its reason."""
        from trainer.data.parquet_rows import predict_chunks

        if kind != "parquet":
            return None
        columns = (self.image_column, self.label_column)
        mode = str(self.resize_mode)
        return predict_chunks(files, columns, self.class_names, preprocess, num_classes, batch_size, mode)
