"""The schemas of the config groups with options: `dataset=`, `model=`, `optimizer=`, `strategy=`.

    python run.py dataset=cifar model=vgg19 optimizer=sgd strategy=mirrored

Each group has a base schema that `Config` types the section with; each option file of
`conf/<group>/` starts from a subclass (its `/hydra/schema/<group>/<name>`), so an unknown
key or a wrong type fails when Hydra composes the config. The model, optimizer and strategy
name their builder in `_target_`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from omegaconf import MISSING

from trainer.config.fields import (
    Channels,
    ClusterSource,
    Compression,
    ResizeMode,
    ScheduleName,
    TFRecordFormat,
    ValSource,
    chosen,
    file_list,
    require,
)
from trainer.data.augmentation import Augmentation
from trainer.data.cache import MODES as CACHE_MODES
from trainer.models import IMAGENET_VGG19_MIN_INPUT, VGG19_MIN_INPUT

log = logging.getLogger(__name__)


# --- dataset= -------------------------------------------------------------------------------------------------


@dataclass
class DatasetConfig:
    """What every dataset option shares: the part `_target_` names (`trainer.data.parts`) and the pipeline's keys.

    Every key but the pipeline's (`PIPELINE`) goes to the part, with `image_size` as the side stored images are
    resized to (`resize_to`)."""

    PIPELINE: ClassVar[tuple[str, ...]] = (
        "_target_",
        "shuffle_buffer",
        "cache",
        "cache_dir",
        "cache_memory_mb",
        "standardize",
        "augment",
        "folds",
        "fold",
    )
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
        """The keys the part takes: all but the pipeline's, enum choices as plain strings, `image_size` resized."""
        options = {key: value for key, value in vars(self).items() if key not in self.PIPELINE and key != self.OPEN}
        options = {key: str(value) if isinstance(value, Enum) else value for key, value in options.items()}
        return {**options, **(getattr(self, self.OPEN) if self.OPEN else {}), "image_size": self.resize_to}


@dataclass
class LabeledFilesConfig(DatasetConfig):
    """Record files whose labels index a fixed list of classes: `BinaryDatasetConfig`, `TFRecordDatasetConfig`."""

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


@dataclass
class BinaryDatasetConfig(LabeledFilesConfig):
    """Fixed-length binary records: label bytes, then the pixels channel-first (CIFAR, the bundled digits)."""

    _target_: str = "trainer.data.binary_files.BinaryFiles"  # the dataset part

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


@dataclass
class TFRecordDatasetConfig(LabeledFilesConfig):
    """TFRecord shards: the converter's output or the classic Cats-vs-Dogs files."""

    _target_: str = "trainer.data.tfrecord_files.TFRecordFiles"  # the dataset part

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


@dataclass
class FolderDatasetConfig(DatasetConfig):
    """`dataset=folder`: class sub-folders of image files (`trainer.data.folder.ImageFolder`)."""

    _target_: str = "trainer.data.folder.ImageFolder"  # the dataset part
    name: str = "folder"  # the option's name
    class_names: list[str] | None = None  # in label order; null: the class folders' names, sorted
    val_fraction: float = 0.0  # share of each class held out for val (one <class>/ tree, or train/ without val/)
    test_fraction: float = 0.0  # share of each class held out for test (one <class>/ tree)
    split_seed: int = 0  # fixes the split: the same files in each split for every run and seed
    resize_mode: ResizeMode = ResizeMode.resize  # resize (squash) | crop (centre square) | pad (onto black)
    image_size: int = 224  # images are decoded and resized to this side: the model input unless augment.crop crops

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, "dataset.image_size", ">= 1", self.image_size)
        for key in ("val_fraction", "test_fraction"):
            require(0 <= getattr(self, key) < 1, f"dataset.{key}", "in [0, 1)", getattr(self, key))
        require(
            self.val_fraction + self.test_fraction < 1,
            "dataset.val_fraction + dataset.test_fraction",
            "below 1",
            self.val_fraction + self.test_fraction,
        )
        if self.class_names is not None:
            require(len(self.class_names) >= 2, "dataset.class_names", "two names or more, or null", self.class_names)
        self.augment.check_fits(self.resize_to)


@dataclass
class ParquetDatasetConfig(DatasetConfig):
    """`dataset=parquet`: Parquet files or a `datasets` save_to_disk folder (`trainer.data.parquet.ArrowFiles`)."""

    _target_: str = "trainer.data.parquet.ArrowFiles"  # the dataset part
    name: str = "parquet"  # the option's name
    image_column: str = "image"  # encoded image bytes, or the Image feature's {bytes, path} struct
    label_column: str = "label"  # integer labels (a ClassLabel's names become the class names)
    train_split: str = "train"  # split names: the files' prefix (train-00000-of-00002.parquet) or folder (train/)
    val_split: str = "validation"  # missing: set val_fraction to hold out a share of the train split
    test_split: str = "test"  # missing: the test split is the validation split
    class_names: list[str] | None = None  # in label order; null: the ClassLabel's names, else "0", "1", ...
    val_fraction: float = 0.0  # share of each class of the train split held out for val (when no val split)
    resize_mode: ResizeMode = ResizeMode.resize  # resize (squash) | crop (centre square) | pad (onto black)
    image_size: int = 224  # images are decoded and resized to this side: the model input unless augment.crop crops

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, "dataset.image_size", ">= 1", self.image_size)
        require(0 <= self.val_fraction < 1, "dataset.val_fraction", "in [0, 1)", self.val_fraction)
        for key in ("image_column", "label_column", "train_split", "val_split", "test_split"):
            require(bool(getattr(self, key)), f"dataset.{key}", "a name", getattr(self, key))
        if self.class_names is not None:
            require(len(self.class_names) >= 2, "dataset.class_names", "two names or more, or null", self.class_names)
        self.augment.check_fits(self.resize_to)


@dataclass
class TFDSDatasetConfig(DatasetConfig):
    """`dataset=tfds`: a prepared TensorFlow Datasets folder, read offline (`trainer.data.tfds_files.TFDSFiles`)."""

    _target_: str = "trainer.data.tfds_files.TFDSFiles"  # the dataset part
    name: str = "tfds"  # the option's name
    tfds_name: str = MISSING  # the TFDS dataset's name (cats_vs_dogs): DATA_DIR/NAME/[CONFIG/]VERSION/
    version: str | None = None  # the version folder to read (1.0.0); null: the newest found
    image_key: str = "image"  # the Image feature (encoded PNG or JPEG bytes)
    label_key: str = "label"  # the integer label feature (a ClassLabel names the classes)
    train_split: str = "train"  # TFDS split names
    val_split: str = "validation"  # missing: set val_fraction to hold out the last share of the train split
    test_split: str = "test"  # missing: the test split is the validation split
    val_fraction: float = 0.0  # no val split: share of the train split's records held out for val, from its end
    class_names: list[str] | None = None  # in label order; null: the ClassLabel's names (needed without one)
    image_size: int = 224  # images are decoded and resized to this side: the model input unless augment.crop crops

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.image_size >= 1, "dataset.image_size", ">= 1", self.image_size)
        require(0 <= self.val_fraction < 1, "dataset.val_fraction", "in [0, 1)", self.val_fraction)
        for key in ("tfds_name", "image_key", "label_key", "train_split", "val_split", "test_split"):
            require(bool(getattr(self, key)), f"dataset.{key}", "a name", getattr(self, key))
        if self.version is not None:
            parts = str(self.version).split(".")
            require(
                len(parts) == 3 and all(part.isdigit() for part in parts),
                "dataset.version",
                "a version folder's name such as 1.0.0, or null",
                self.version,
            )
        if self.class_names is not None:
            require(len(self.class_names) >= 2, "dataset.class_names", "two names or more, or null", self.class_names)
        self.augment.check_fits(self.resize_to)


@dataclass
class CustomDatasetConfig(DatasetConfig):
    """`dataset=custom`: your own part (`dataset._target_=my_package.MySource`); its own keys go to `options`."""

    OPEN: ClassVar[str | None] = "options"

    name: str = "custom"  # the option's name
    data_dir: str = "."  # handed to the part like every key
    options: dict[str, Any] = field(default_factory=dict)  # the part's own keys (dataset.root=/data ...)


# --- model= ---------------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """What every model option shares. Its other keys go to the builder `_target_` names."""

    RESERVED: ClassVar[tuple[str, ...]] = ("_target_", "name", "preprocessing", "init_from")  # the trainer's
    PRETRAINED_BASE: ClassVar[bool] = False  # trains in phases: the new head first, then the base (finetune.*)
    MIN_INPUT: ClassVar[tuple[int, str]] = (1, "")  # (the smallest input side the builder takes, why); your own
    # model's builder checks its own, whatever its name

    _target_: str = MISSING  # the builder: called with num_classes, input_shape and the other keys
    name: str = MISSING  # the option's name: the log, the curves' title
    preprocessing: str | None = None  # null: the dataset's normalization | caffe (what ImageNet weights expect)
    init_from: str | None = None  # a run folder or .keras file: this new run starts from its weights

    def __post_init__(self) -> None:
        require(
            self.preprocessing in (None, "caffe"),
            "model.preprocessing",
            "null (the dataset's normalization) or caffe",
            self.preprocessing,
        )

    def builder_options(self) -> dict[str, Any]:
        """The keys the builder takes besides num_classes and input_shape."""
        return {key: value for key, value in vars(self).items() if key not in self.RESERVED}


def _check_head(model: Any) -> None:
    """The classifier-head keys both VGG19 models share."""
    require(model.fc_units >= 1, "model.fc_units", ">= 1", model.fc_units)
    require(0 <= model.dropout < 1, "model.dropout", "in [0, 1)", model.dropout)
    require(model.weight_decay >= 0, "model.weight_decay", ">= 0", model.weight_decay)


@dataclass
class VGG19Config(ModelConfig):
    MIN_INPUT: ClassVar[tuple[int, str]] = VGG19_MIN_INPUT

    _target_: str = "trainer.models.vgg19.build_vgg19"  # the builder
    name: str = "vgg19"  # the option's name
    width_multiplier: float = 1.0  # scales every layer's channels; 0.125 for tiny test models
    fc_units: int = 512  # units of fc1 and fc2 before width scaling
    dropout: float = 0.5  # after fc1 and fc2; 0 disables
    weight_decay: float = 5e-4  # L2 on every conv and dense kernel
    batch_norm: bool = True  # after each convolution and hidden dense layer (from scratch, VGG19 barely learns without)
    batch_norm_momentum: float = 0.9  # moving statistics; Keras's 0.99 lags behind in short runs

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 < self.width_multiplier <= 4, "model.width_multiplier", "in (0, 4]", self.width_multiplier)
        _check_head(self)
        require(
            round(64 * self.width_multiplier) >= 1,
            "model.width_multiplier",
            "> 1/128 (block1's 64 channels would round to none)",
            self.width_multiplier,
        )
        if self.width_multiplier < 0.125:
            log.warning(
                "model.width_multiplier=%g leaves block1 %d channel(s), fewer than one per 8 of VGG19's 64; "
                "0.125 is the smallest width tested",
                self.width_multiplier,
                round(64 * self.width_multiplier),
            )
        require(0 <= self.batch_norm_momentum < 1, "model.batch_norm_momentum", "in [0, 1)", self.batch_norm_momentum)


@dataclass
class VGG19ImageNetConfig(ModelConfig):
    PRETRAINED_BASE: ClassVar[bool] = True
    MIN_INPUT: ClassVar[tuple[int, str]] = IMAGENET_VGG19_MIN_INPUT

    _target_: str = "trainer.models.finetune.build_vgg19_imagenet"  # the builder
    name: str = "vgg19_imagenet"  # the option's name
    preprocessing: str | None = "caffe"  # what the ImageNet weights expect: BGR, mean-subtracted
    weights: str | None = "imagenet"  # imagenet (Keras downloads and caches) | a local .h5/.weights.h5 | null
    fc_units: int = 256  # the new head's hidden layer
    dropout: float = 0.5  # before the classifier; off at evaluation
    weight_decay: float = 1e-4  # L2 on the new head's kernels

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_head(self)
        require(self.preprocessing == "caffe", "model.preprocessing", "caffe (the weights fix it)", self.preprocessing)


@dataclass
class CustomModelConfig(ModelConfig):
    """`model=custom`: the builder's keys are the user's own (`model.units=64`), collected into `options`."""

    OPEN: ClassVar[str] = "options"  # keys the schema does not know go here (see trainer.config.store)

    name: str = "custom"  # the option's name; name your own file's model here
    options: dict[str, Any] = field(default_factory=dict)  # the builder's keys: what you type as model.KEY=...

    def builder_options(self) -> dict[str, Any]:
        return dict(self.options)


# --- optimizer= -----------------------------------------------------------------------------------------------


@dataclass
class ScheduleConfig:
    """The learning rate, step by step: constant, decayed at boundaries, or cosine after a linear warm-up."""

    # `name` picks the schedule's function in trainer.training.optimizers (`target`), built like every `_target_`
    name: ScheduleName = ScheduleName.constant  # constant | step | cosine
    warmup_epochs: float = 0.0  # cosine: linear warmup from 0 to optimizer.lr
    boundaries: list[float] = field(default_factory=list)  # step: epochs at which lr is multiplied by factor
    factor: float = 0.1  # step: multiplier at each boundary
    alpha: float = 0.0  # cosine: final lr as a fraction of optimizer.lr

    def __post_init__(self) -> None:
        require(self.warmup_epochs >= 0, "optimizer.schedule.warmup_epochs", ">= 0", self.warmup_epochs)
        require(self.factor > 0, "optimizer.schedule.factor", "> 0", self.factor)
        require(
            list(self.boundaries) == sorted(self.boundaries) and all(b > 0 for b in self.boundaries),
            "optimizer.schedule.boundaries",
            "increasing positive epochs",
            list(self.boundaries),
        )
        require(0 <= self.alpha <= 1, "optimizer.schedule.alpha", "in [0, 1]", self.alpha)

    @property
    def target(self) -> str:
        """The builder of this schedule, built like every `_target_` (`trainer.targets.build_target`): the choice
        names its function, one per choice."""
        return f"trainer.training.optimizers.{self.name}"

    @property
    def steps_the_rate(self) -> bool:
        """Whether it sets the rate at every step (a callback that sets it per epoch would be overridden)."""
        return self.name != ScheduleName.constant

    @property
    def warms_up(self) -> bool:
        """Whether `warmup_epochs` applies (cosine's linear warm-up)."""
        return self.name == ScheduleName.cosine


@dataclass
class OptimizerConfig:
    """What every optimizer option shares. Its other keys go to the Keras optimizer `_target_` names."""

    RESERVED: ClassVar[tuple[str, ...]] = (
        "_target_", "name", "lr", "scale_with_replicas", "lr_batch_size", "schedule", "ema_momentum"
    )  # fmt: skip

    _target_: str = MISSING  # a Keras optimizer class: called with learning_rate, clipnorm and its own keys
    name: str = MISSING  # the option's name: the log, resume's check of the experiment
    lr: float = 0.01  # peak learning rate
    clipnorm: float | None = None  # clip each gradient to this norm
    scale_with_replicas: bool = False  # multiply lr by the number of replicas (linear scaling rule)
    lr_batch_size: int | None = None  # the global batch lr is tuned for: batch B trains at lr x B / lr_batch_size
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # the learning rate, step by step
    ema_momentum: float | None = None  # EMA of the weights (validation, checkpoints, export use it); null: off

    def __post_init__(self) -> None:
        require(self.lr > 0, "optimizer.lr", "> 0", self.lr)
        momentum = self.ema_momentum
        require(momentum is None or 0 < momentum < 1, "optimizer.ema_momentum", "in (0, 1) or null", momentum)
        require(self.clipnorm is None or self.clipnorm > 0, "optimizer.clipnorm", "> 0 or null", self.clipnorm)
        require(
            self.lr_batch_size is None or self.lr_batch_size >= 1,
            "optimizer.lr_batch_size",
            ">= 1 or null",
            self.lr_batch_size,
        )
        require(
            not (self.lr_batch_size and self.scale_with_replicas),
            "optimizer.lr_batch_size",
            "null when optimizer.scale_with_replicas=true (both scale lr)",
            self.lr_batch_size,
        )

    def keras_options(self) -> dict[str, Any]:
        """The keyword arguments of the Keras optimizer besides its learning rate (and gradient accumulation)."""
        options = {key: value for key, value in vars(self).items() if key not in self.RESERVED}
        if self.ema_momentum is not None:
            options.update(use_ema=True, ema_momentum=self.ema_momentum)
        return options


@dataclass
class SGDConfig(OptimizerConfig):
    _target_: str = "keras.optimizers.SGD"  # the Keras class
    name: str = "sgd"  # the option's name
    momentum: float = 0.9  # velocity kept from step to step
    nesterov: bool = False  # Nesterov momentum

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 <= self.momentum < 1, "optimizer.momentum", "in [0, 1)", self.momentum)


@dataclass
class AdamConfig(OptimizerConfig):
    _target_: str = "keras.optimizers.Adam"  # the Keras class (another with the same keys works: Nadam)
    name: str = "adam"  # the option's name
    beta_1: float = 0.9  # decay of the first-moment estimates
    beta_2: float = 0.999  # decay of the second-moment estimates

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("beta_1", "beta_2"):
            require(0 <= getattr(self, key) < 1, f"optimizer.{key}", "in [0, 1)", getattr(self, key))


@dataclass
class AdamWConfig(AdamConfig):
    _target_: str = "keras.optimizers.AdamW"  # the Keras class
    name: str = "adamw"  # the option's name
    weight_decay: float = 0.004  # decoupled weight decay (Keras's default)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.weight_decay >= 0, "optimizer.weight_decay", ">= 0", self.weight_decay)


# --- strategy= ------------------------------------------------------------------------------------------------


@dataclass
class StrategyConfig:
    """What every strategy option shares; `_target_` builds the `tf.distribute.Strategy` from the other keys."""

    SPANS_WORKERS: ClassVar[bool] = False  # a cluster of worker processes: roles (chief, evaluator), one machine each

    _target_: str = MISSING  # a function of trainer.distribute.strategies, called with the other keys
    name: str = MISSING  # the option's name: the log, resume's check of the experiment


@dataclass
class SingleStrategyConfig(StrategyConfig):
    _target_: str = "trainer.distribute.strategies.single"  # the builder
    name: str = "single"  # the option's name
    device: str | None = None  # e.g. "/gpu:1" (a OneDeviceStrategy); default: no strategy, first GPU else CPU


@dataclass
class MirroredStrategyConfig(StrategyConfig):
    _target_: str = "trainer.distribute.strategies.mirrored"  # the builder
    name: str = "mirrored"  # the option's name
    devices: list[str] | None = None  # default: all GPUs
    cpu_devices: int = 0  # > 0 splits the CPU into this many logical devices instead

    def __post_init__(self) -> None:
        require(self.cpu_devices >= 0, "strategy.cpu_devices", ">= 0", self.cpu_devices)


@dataclass
class MultiWorkerStrategyConfig(StrategyConfig):
    SPANS_WORKERS: ClassVar[bool] = True

    _target_: str = "trainer.distribute.strategies.multi_worker"  # the builder
    name: str = "multi_worker"  # the option's name
    cluster: ClusterSource = ClusterSource.auto  # auto (first found, in order) | tf_config | workers | skypilot | slurm
    workers: list[str] | None = None  # host:port of every worker, same order on all of them
    task_index: int | None = None  # this worker's position in `workers`
    timeout_seconds: float = 600.0  # a step waiting longer on its peers (one hung) stops every worker
    heartbeat_seconds: float = 10.0  # a worker silent this long (killed, its machine lost) stops its peers
    startup_timeout: float = 600.0  # seconds to wait for every worker to come up (logged every 10 s), then to connect
    slurm_port_base: int = 8888  # cluster=slurm|skypilot: the port of a host's first task (its next tasks count up)

    def __post_init__(self) -> None:
        require(self.timeout_seconds > 0, "strategy.timeout_seconds", "> 0", self.timeout_seconds)
        require(self.heartbeat_seconds > 0, "strategy.heartbeat_seconds", "> 0", self.heartbeat_seconds)
        require(self.startup_timeout > 0, "strategy.startup_timeout", "> 0", self.startup_timeout)
