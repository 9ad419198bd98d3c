"""`dataset=folder`: class sub-folders of JPEG, PNG, GIF, BMP or WebP files (read by `trainer.data.folder`).

python run.py dataset=folder dataset.data_dir=photos/                            # photos/{train,val,test}/<class>/
python run.py dataset=folder dataset.data_dir=PetImages/ dataset.val_fraction=0.1 dataset.test_fraction=0.1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.data.formats.base import PhotoConfig, ResizeMode
from trainer.fields import require

if TYPE_CHECKING:  # TensorFlow starts only when a format loads
    from trainer.data.parts import Splits

SPLITS = ("train", "val", "test")


@dataclass
class ImageFolder(PhotoConfig):
    """`DIR/train/<class>/`, `DIR/val/<class>/` (and `DIR/test/<class>/`), or one `DIR/<class>/` tree split per
    class by `val_fraction` and `test_fraction`; `val_fraction` also splits a `train/` without `val/`."""

    _target_: str = "trainer.data.formats.folder.ImageFolder"  # the dataset part
    name: str = "folder"  # the option's name
    test_fraction: float = 0.0  # share of each class held out for test (one <class>/ tree)
    split_seed: int = 0  # fixes the split: the same files in each split for every run and seed
    resize_mode: ResizeMode = ResizeMode.resize  # resize (squash) | crop (centre square) | pad (onto black)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 <= self.test_fraction < 1, "dataset.test_fraction", "in [0, 1)", self.test_fraction)
        require(
            self.val_fraction + self.test_fraction < 1,
            "dataset.val_fraction + dataset.test_fraction",
            "below 1",
            self.val_fraction + self.test_fraction,
        )

    def load(self, check_val: bool = True, reads: tuple[str, ...] = SPLITS) -> Splits:
        """Lists the files and decodes each of the splits `reads` once (`trainer.data.folder`)."""
        from trainer.data.folder import FolderLoader

        return FolderLoader(self).load(check_val, reads)
