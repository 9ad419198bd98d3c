"""What every dataset format shares: the pipeline's keys, and the record files whose labels index fixed classes.

python run.py dataset=cifar dataset.cache=disk dataset.augment.crop=pad
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from trainer.data.augmentation import Augmentation
from trainer.data.cache import MODES as CACHE_MODES
from trainer.fields import MISSING, choice, file_list, require

log = logging.getLogger(__name__)

ResizeMode = choice("ResizeMode", "resize", "crop", "pad")  # trainer.data.decode.RESIZE_MODES


@dataclass
class DatasetConfig:
    """What every dataset option shares: the part `_target_` names (`trainer.data.parts`) and the pipeline's keys.

    A built-in format is its own part: the checked section is loaded as it is. Every key but the pipeline's
    (`PIPELINE`) goes to a part `_target_` names otherwise (`dataset=custom`), with `image_size` as the side
    stored images are resized to (`resize_to`)."""

    PIPELINE: ClassVar[tuple[str, ...]] = (
        "_target_", "shuffle_buffer", "cache", "cache_dir", "cache_memory_mb", "standardize", "augment", "folds", "fold"
    )  # fmt: skip
    OPEN: ClassVar[str | None] = None  # dataset=custom: the field collecting the part's own keys

    _target_: str = MISSING  # the dataset part: a class (or function) taking this section's keys
    name: str = MISSING  # the option's name (digits, cifar, cats_dogs, folder): the log, the curves' title
    data_dir: str = MISSING  # folder holding the data (relative paths resolve against the launch folder)
    image_size: int = 0  # resize stored images to this side (0: as stored); the model input unless augment.crop crops
    shuffle_buffer: int = 1000  # records held for shuffling; >= the training set size gives a full shuffle
    cache: str = "auto"  # decoded images kept after their first decode: auto | memory | disk | off (trainer.data.cache)
    cache_dir: str | None = None  # dataset.cache=disk's folder; null: ~/.cache/vggtrain/decoded
    cache_memory_mb: float = 1024.0  # dataset.cache=auto: photos decoded to at most this stay in memory, more on disk
    standardize: bool = True  # per-image standardization, a layer of the model (zero mean, unit variance)
    augment: Augmentation = field(default_factory=Augmentation)  # training augmentation: the host's and the model's
    folds: int = 0  # k-fold cross-validation: train + val are split into this many folds (0: no cross-validation)
    fold: int = 0  # with folds: this fold is the validation split, the others the training split

    def __post_init__(self) -> None:
        require(self.image_size >= 0, "dataset.image_size", ">= 0", self.image_size)
        require(self.shuffle_buffer >= 1, "dataset.shuffle_buffer", ">= 1", self.shuffle_buffer)
        if str(self.cache).lower() in ("true", "false"):  # vggtrain 0.1's switch: true kept the images in memory
            chosen = "memory" if str(self.cache).lower() == "true" else "off"
            log.warning("dataset.cache=%s is dataset.cache=%s now (auto, memory, disk or off)", self.cache, chosen)
            self.cache = chosen
        require(self.cache in CACHE_MODES, "dataset.cache", f"one of {', '.join(CACHE_MODES)}", self.cache)
        require(self.cache_memory_mb >= 0, "dataset.cache_memory_mb", ">= 0", self.cache_memory_mb)
        require(self.folds != 1, "dataset.folds", "0 (no cross-validation) or >= 2 (one fold validates)", self.folds)
        require(self.folds >= 0, "dataset.folds", "0 (no cross-validation) or >= 2", self.folds)
        if self.folds:
            require(0 <= self.fold < self.folds, "dataset.fold", f"in [0, dataset.folds={self.folds})", self.fold)

    @property
    def resize_to(self) -> int:
        """Side the stored images are resized to before any crop."""
        return self.image_size

    @property
    def input_size(self) -> int:
        """Side of the square images the model sees: the crop if any, else the resized size."""
        return self.augment.output_size(self.resize_to)

    def part_options(self) -> dict[str, Any]:
        """The keys a part `_target_` names takes: all but the pipeline's, choices as plain strings, `image_size`
        resized."""
        options = {key: value for key, value in vars(self).items() if key not in self.PIPELINE and key != self.OPEN}
        options = {key: str(value) if isinstance(value, Enum) else value for key, value in options.items()}
        return {**options, **(getattr(self, self.OPEN) if self.OPEN else {}), "image_size": self.resize_to}


@dataclass
class PhotoConfig(DatasetConfig):
    """Encoded photos decoded and resized at `image_size` (folder, Parquet, TFDS), their classes named or found."""

    class_names: list[str] | None = None  # in label order; null: the class folders' (sorted) or the ClassLabel's
    val_fraction: float = 0.0  # no validation split: share of train held out for val (per class; TFDS: its end)
    image_size: int = 224  # images are decoded and resized to this side: the model input unless augment.crop crops

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, "dataset.image_size", ">= 1", self.image_size)
        require(0 <= self.val_fraction < 1, "dataset.val_fraction", "in [0, 1)", self.val_fraction)
        if self.class_names is not None:
            require(len(self.class_names) >= 2, "dataset.class_names", "two names or more, or null", self.class_names)
        self.augment.check_fits(self.resize_to)

    def names(self, *keys: str) -> None:
        """Each of `keys` (columns, features, split names) is set."""
        for key in keys:
            require(bool(getattr(self, key)), f"dataset.{key}", "a name", getattr(self, key))


@dataclass
class LabeledFilesConfig(DatasetConfig):
    """Record files whose labels index a fixed list of classes: `BinaryFiles`, `TFRecordFiles`."""

    train_files: Any = MISSING  # a file name, glob or list of them
    test_files: Any = MISSING  # likewise, for the test split
    num_classes: int = MISSING  # classes the labels index
    class_names: list[str] = MISSING  # in label order

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes is not None:  # null (TFRecords): the converter's manifest's
            require(self.num_classes >= 2, "dataset.num_classes", ">= 2", self.num_classes)
        if self.num_classes is not None and self.class_names is not None:
            require(
                len(self.class_names) == self.num_classes,
                "dataset.class_names",
                f"a list of num_classes={self.num_classes} names",
                list(self.class_names),
            )
        self.train_files = file_list(self.train_files, "dataset.train_files")
        self.test_files = file_list(self.test_files, "dataset.test_files")
