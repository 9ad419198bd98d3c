"""Typed schemas for every config section, each default and its meaning in one place.

Each YAML option in `conf/<group>/` starts from one of these schemas (its defaults
list names `/hydra/schema/<group>/<name>`), and `Config` types every section by the
base class its options share, so an unknown key or a wrong type fails when Hydra
composes the config. Ranges are checked in `__post_init__`, which runs when
`trainer.config.to_settings` turns the composed config into these dataclasses.
The parts a run builds (model, optimizer, strategy, callbacks, trackers) name their
builder in `_target_`, and the task layer builds them with `hydra.utils.instantiate`.

    python run.py model.dropout=1.5   # -> error: model.dropout must be in [0, 1); got 1.5
    python run.py --cfg job           # every key with its value
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from omegaconf import MISSING

from trainer.data.augmentation import Augmentation
from trainer.errors import ConfigError
from trainer.models import MIN_INPUT_SIZES

log = logging.getLogger(__name__)


class Choice(str, Enum):
    """An enum-like option: OmegaConf rejects any other value when Hydra composes the config, naming
    the key and the valid choices. Members compare, hash and print as their plain strings."""

    __str__ = str.__str__
    __format__ = str.__format__


def _choice(name: str, *values: str) -> type[Choice]:
    return Choice(name, {value: value for value in values})


ValSource = _choice("ValSource", "train", "test")
TFRecordFormat = _choice("TFRecordFormat", "raw", "jpeg")
ScheduleName = _choice("ScheduleName", "constant", "step", "cosine")
Precision = _choice("Precision", "float32", "mixed_float16", "mixed_bfloat16")
Direction = _choice("Direction", "max", "min")
EvaluateSplit = _choice("EvaluateSplit", "val", "test")
Split = _choice("Split", "train", "val", "test")
WandbMode = _choice("WandbMode", "offline", "online", "disabled")
Mode = _choice("Mode", "train", "evaluate", "predict", "inspect", "export")


def require(condition: bool, key: str, expected: str, value: Any) -> None:
    """Raises `ConfigError("KEY must be EXPECTED; got VALUE")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key} must be {expected}; got {value!r}")


def _file_list(value: Any, key: str) -> list[str]:
    """A list of paths or globs from a list or from one string (`dataset.train_files=/data/x_*`)."""
    files = [value] if isinstance(value, str) else list(value or [])
    require(bool(files) and all(isinstance(f, str) and f for f in files), key, "a glob or a non-empty list", value)
    return files


# --- dataset= -------------------------------------------------------------------------------------------------


@dataclass
class DatasetConfig:
    """What every dataset option shares; `BinaryDatasetConfig` and `TFRecordDatasetConfig` add their layout."""

    name: str = MISSING  # the option's name (digits, cifar, cats_dogs): the log, the curves' title, checkpoints
    data_dir: str = MISSING  # folder holding the files (relative paths resolve against the launch folder)
    train_files: Any = MISSING  # a file name, glob or list of them
    test_files: Any = MISSING  # likewise, for the test split
    num_classes: int = MISSING  # classes the labels index
    class_names: list[str] = MISSING  # in label order
    image_size: int = 0  # model input side: stored images are resized to it (binary: 0 = the stored size)
    shuffle_buffer: int = 1000  # records held for shuffling; >= the training set size gives a full shuffle
    cache: bool = False  # keep the decoded images in memory after the first epoch (small datasets)
    standardize: bool = True  # per-image standardization, a layer of the model (zero mean, unit variance)
    augment: Augmentation = field(default_factory=Augmentation)  # training augmentation: the host's and the model's

    def __post_init__(self) -> None:
        require(self.num_classes >= 2, "dataset.num_classes", ">= 2", self.num_classes)
        require(
            len(self.class_names) == self.num_classes,
            "dataset.class_names",
            f"a list of num_classes={self.num_classes} names",
            list(self.class_names),
        )
        require(self.image_size >= 0, "dataset.image_size", ">= 0", self.image_size)
        require(self.shuffle_buffer >= 1, "dataset.shuffle_buffer", ">= 1", self.shuffle_buffer)
        self.train_files = _file_list(self.train_files, "dataset.train_files")
        self.test_files = _file_list(self.test_files, "dataset.test_files")

    @property
    def resize_to(self) -> int:
        """Side the stored images are resized to before any crop."""
        return self.image_size

    @property
    def input_size(self) -> int:
        """Side of the square images the model sees: the crop if any, else the resized size."""
        return self.augment.output_size(self.resize_to)


@dataclass
class BinaryDatasetConfig(DatasetConfig):
    """Fixed-length binary records: label bytes, then the pixels channel-first (CIFAR, the bundled digits)."""

    search_subdirs: list[str] = field(default_factory=list)  # also look in these folders below data_dir
    height: int = MISSING  # stored image height
    width: int = MISSING  # stored image width
    channels: int = MISSING  # 1 or 3
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
        for key in ("height", "width", "channels", "label_bytes"):
            require(getattr(self, key) >= 1, f"dataset.{key}", ">= 1", getattr(self, key))
        require(self.channels in (1, 3), "dataset.channels", "1 or 3", self.channels)
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
class TFRecordDatasetConfig(DatasetConfig):
    """TFRecord shards: the converter's output or the classic Cats-vs-Dogs files."""

    data_dir: str = "."  # the converter's OUTPUT_DIR; the globs below usually start with it
    val_files: Any = MISSING  # a glob or a list of globs, for the validation split
    format: TFRecordFormat = TFRecordFormat.raw  # raw (label + img_raw pixels) | jpeg (image/encoded ...)
    stored_size: int = 224  # raw: side of the stored images
    image_key: str | None = None  # feature keys; null: the format's defaults
    label_key: str | None = None  # feature key of the integer label
    filename_key: str | None = None  # feature key of the stored file name (unlabeled records, predictions)
    compression: str = "auto"  # auto (from each file's first bytes) | none | gzip | zlib
    num_classes: int = 2  # classes the labels index
    class_names: list[str] = field(default_factory=lambda: ["cat", "dog"])  # the manifest's win when present
    image_size: int = 224  # model input side: stored images are resized to it

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.compression in ("auto", "none", "gzip", "zlib"),
            "dataset.compression",
            "auto, none, gzip or zlib",
            self.compression,
        )
        for key in ("stored_size", "image_size"):
            require(getattr(self, key) >= 1, f"dataset.{key}", ">= 1", getattr(self, key))
        self.val_files = _file_list(self.val_files, "dataset.val_files")
        self.augment.check_fits(self.resize_to)


# --- model= ---------------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """What every model option shares. Its other keys go to the builder `_target_` names."""

    RESERVED: ClassVar[tuple[str, ...]] = ("_target_", "name", "preprocessing")  # read by the trainer
    PRETRAINED_BASE: ClassVar[bool] = False  # trains in phases: the new head first, then the base (finetune.*)

    _target_: str = MISSING  # the builder: called with num_classes, input_shape and the other keys
    name: str = MISSING  # the option's name: the log, the curves' title
    preprocessing: str | None = None  # null: the dataset's normalization | caffe (what ImageNet weights expect)

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
    _target_: str = "trainer.models.vgg19.build_vgg19"  # the builder
    name: str = "vgg19"  # the option's name
    width_multiplier: float = 1.0  # scales every layer's channels; 0.125 for tiny test models
    fc_units: int = 512  # units of fc1 and fc2 before width scaling
    dropout: float = 0.5  # after fc1 and fc2; 0 disables
    weight_decay: float = 5e-4  # L2 on every conv and dense kernel
    batch_norm: bool = True  # batch normalization after each convolution (VGG19 from scratch barely learns without)
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


@dataclass
class OptimizerConfig:
    """What every optimizer option shares. Its other keys go to the Keras optimizer `_target_` names."""

    RESERVED: ClassVar[tuple[str, ...]] = ("_target_", "name", "lr", "scale_with_replicas", "lr_batch_size", "schedule")

    _target_: str = MISSING  # a Keras optimizer class: called with learning_rate, clipnorm and its own keys
    name: str = MISSING  # the option's name: the log, resume's check of the experiment
    lr: float = 0.01  # peak learning rate
    clipnorm: float | None = None  # clip each gradient to this norm
    scale_with_replicas: bool = False  # multiply lr by the number of replicas (linear scaling rule)
    lr_batch_size: int | None = None  # the global batch lr is tuned for: batch B trains at lr x B / lr_batch_size
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # the learning rate, step by step

    def __post_init__(self) -> None:
        require(self.lr > 0, "optimizer.lr", "> 0", self.lr)
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
        """The keyword arguments of the Keras optimizer besides its learning rate."""
        return {key: value for key, value in vars(self).items() if key not in self.RESERVED}


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
    _target_: str = "trainer.distribute.strategies.multi_worker"  # the builder
    name: str = "multi_worker"  # the option's name
    cluster: str = "auto"  # auto | tf_config | workers | slurm
    workers: list[str] | None = None  # host:port of every worker, same order on all of them
    task_index: int | None = None  # this worker's position in `workers`
    timeout_seconds: float = 600.0  # a collective waiting longer (a worker died) fails the run

    def __post_init__(self) -> None:
        require(self.timeout_seconds > 0, "strategy.timeout_seconds", "> 0", self.timeout_seconds)


# --- trainer, callbacks=, logger= -----------------------------------------------------------------------------


def _class_weight_option(value: Any) -> str | dict[int, float] | None:
    """null/none, `balanced`, or a {class index: weight > 0} mapping, checked."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    if isinstance(value, str) and value.lower() == "balanced":
        return "balanced"
    expected = "null, balanced or a mapping {class index: weight > 0}, e.g. {0: 1.0, 1: 3.0}"
    require(isinstance(value, dict) and bool(value), "trainer.class_weight", expected, value)
    weights = {}
    for key, weight in value.items():
        try:
            index, weight = int(key), float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"trainer.class_weight must be {expected}; got {value!r}") from None
        require(index >= 0 and weight > 0, "trainer.class_weight", expected, value)
        weights[index] = weight
    return weights


@dataclass
class TrainerConfig:
    epochs: int = 30  # passes over the training split
    batch_size: int = 128  # global batch size, summed over replicas
    steps_per_epoch: int | None = None  # default: training records // batch_size
    verbose: int = 1  # one line per epoch; 1: plus a progress bar within epochs on a terminal (0, 2: none)
    threads: int = 0  # TensorFlow intra-op threads; 0: TensorFlow's default (all cores)
    save_every_steps: int | None = None  # also back up every N steps, not only at epoch ends
    deterministic: bool = False  # TensorFlow op determinism: identical weights run to run, slower
    precision: Precision = Precision.float32  # float32 | mixed_float16 | mixed_bfloat16
    jit_compile: str = "auto"  # auto | true | false (XLA; with a strategy, Keras's auto means off)
    steps_per_execution: int = 1  # training steps run per call into TensorFlow
    label_smoothing: float = 0.0  # targets become (1 - s) one-hot + s / num_classes
    class_weight: Any = None  # null | balanced (n / (classes x n_class), from the training split) | {0: w, ...}
    tf_logs: bool = False  # true: TensorFlow's own start-up and INFO logs too (cuInit, oneDNN, absl, ...)

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "trainer.epochs", ">= 1", self.epochs)
        require(self.batch_size >= 1, "trainer.batch_size", ">= 1", self.batch_size)
        require(
            self.steps_per_epoch is None or self.steps_per_epoch >= 1,
            "trainer.steps_per_epoch",
            ">= 1 or null",
            self.steps_per_epoch,
        )
        require(self.verbose in (0, 1, 2), "trainer.verbose", "0, 1 or 2", self.verbose)
        require(self.threads >= 0, "trainer.threads", ">= 0", self.threads)
        self.jit_compile = str(self.jit_compile).lower()
        require(
            self.jit_compile in ("auto", "true", "false"),
            "trainer.jit_compile",
            "auto, true or false",
            self.jit_compile,
        )
        require(self.steps_per_execution >= 1, "trainer.steps_per_execution", ">= 1", self.steps_per_execution)
        require(0 <= self.label_smoothing < 1, "trainer.label_smoothing", "in [0, 1)", self.label_smoothing)
        self.class_weight = _class_weight_option(self.class_weight)
        require(
            self.save_every_steps is None or self.save_every_steps >= 1,
            "trainer.save_every_steps",
            ">= 1 or null",
            self.save_every_steps,
        )


@dataclass
class EarlyStoppingConfig:
    _target_: str = "keras.callbacks.EarlyStopping"  # the Keras callback
    monitor: str = "${objective.metric}"  # a column of history.csv
    mode: Direction = "${objective.mode}"  # max | min
    patience: int = 5  # epochs without improvement before stopping
    min_delta: float = 0.0  # a smaller change is no improvement
    restore_best_weights: bool = True  # end with the best epoch's weights (best.keras holds them anyway)

    def __post_init__(self) -> None:
        require(self.patience >= 0, "callbacks.early_stopping.patience", ">= 0", self.patience)
        require(self.min_delta >= 0, "callbacks.early_stopping.min_delta", ">= 0", self.min_delta)


@dataclass
class ReduceLROnPlateauConfig:
    _target_: str = "keras.callbacks.ReduceLROnPlateau"  # the Keras callback
    monitor: str = "${objective.metric}"  # a column of history.csv
    mode: Direction = "${objective.mode}"  # max | min
    factor: float = 0.1  # new lr = lr x factor
    patience: int = 3  # epochs without improvement before reducing
    min_delta: float = 0.0  # a smaller change is no improvement
    min_lr: float = 0.0  # never below this

    def __post_init__(self) -> None:
        key = "callbacks.reduce_lr_on_plateau"
        require(0 < self.factor < 1, f"{key}.factor", "in (0, 1)", self.factor)
        require(self.patience >= 0, f"{key}.patience", ">= 0", self.patience)
        require(self.min_lr >= 0, f"{key}.min_lr", ">= 0", self.min_lr)


@dataclass
class CallbacksConfig:
    """Optional Keras callbacks: `callbacks=early_stopping`, `callbacks=[early_stopping,reduce_lr_on_plateau]`,
    or your own: `+callbacks.mine._target_=my_package.MyCallback` (every entry with a `_target_` is built)."""

    OPEN: ClassVar[str] = "extra"  # entries the schema does not know go here (see trainer.config.store)

    early_stopping: EarlyStoppingConfig | None = None  # callbacks=early_stopping: stop when the metric stalls
    reduce_lr_on_plateau: ReduceLROnPlateauConfig | None = None  # callbacks=reduce_lr_on_plateau
    extra: dict[str, Any] = field(default_factory=dict)  # your own entries, each with a _target_


@dataclass
class TensorBoardConfig:
    _target_: str = "keras.callbacks.TensorBoard"  # called with log_dir=RUN/tensorboard and the keys below
    write_graph: bool = False  # the model's graph too (large for VGG19)
    update_freq: str = "epoch"  # epoch, or a number of steps between writes


@dataclass
class MLflowConfig:
    _target_: str = "trainer.tracking.loggers.MLflowTracker"  # the tracker
    tracking_uri: str | None = "${logger.tracking_uri}"  # the store (logger.tracking_uri)
    experiment: str = "${logger.experiment}"  # the experiment (logger.experiment)
    timeout_seconds: float = "${logger.timeout_seconds}"  # a server's reachability check and requests


@dataclass
class WandbConfig:
    _target_: str = "trainer.tracking.loggers.WandbTracker"  # the tracker
    project: str = "${logger.experiment}"  # the W&B project (logger.experiment)
    mode: WandbMode = "${logger.wandb_mode}"  # offline | online | disabled (logger.wandb_mode)
    entity: str | None = "${logger.wandb_entity}"  # team or user (logger.wandb_entity)
    timeout_seconds: float = "${logger.timeout_seconds}"  # how long a run may take to start


@dataclass
class LoggerConfig:
    """Where metrics go besides history.csv: `logger=mlflow`, `logger=[tensorboard,wandb]`, `logger=many`.
    Each tracker chosen is an entry with a `_target_`; the keys below are shared by them."""

    tensorboard: TensorBoardConfig | None = None  # tensorboard/ in the run folder: scalars, lr, sample images
    csv: bool = False  # history.csv only (always written: resuming and curves.png read it)
    mlflow: MLflowConfig | None = None  # logger=mlflow: params, metrics and the run's files in MLflow
    wandb: WandbConfig | None = None  # logger=wandb: the same in Weights & Biases
    experiment: str = "vggtrain"  # MLflow experiment / W&B project
    tracking_uri: str | None = None  # MLflow: null = sqlite:///<launch folder>/outputs/mlflow.db; http://host:port
    timeout_seconds: float = 10.0  # MLflow server: start-up reachability check and each request
    wandb_mode: WandbMode = WandbMode.offline  # offline (no account needed; `wandb sync` later) | online | disabled
    wandb_entity: str | None = None  # W&B team or user (online)

    def __post_init__(self) -> None:
        require(self.timeout_seconds > 0, "logger.timeout_seconds", "> 0", self.timeout_seconds)


# --- the other sections ---------------------------------------------------------------------------------------


@dataclass
class ObjectiveConfig:
    metric: str = "val_accuracy"  # a metric name from history.csv
    mode: Direction = Direction.max  # max | min


@dataclass
class FinetuneConfig:
    freeze_epochs: int = 0  # phase 1: epochs training the head with the whole base frozen
    unfreeze_from: str = "block5_conv1"  # phase 2: base layers from this one on train too (or `all`)
    lr_multiplier: float = 0.1  # phase 2 learning rate = optimizer.lr x this

    def __post_init__(self) -> None:
        require(self.freeze_epochs >= 0, "finetune.freeze_epochs", ">= 0", self.freeze_epochs)
        require(0 < self.lr_multiplier <= 1, "finetune.lr_multiplier", "in (0, 1]", self.lr_multiplier)


@dataclass
class EvaluateConfig:
    split: EvaluateSplit = EvaluateSplit.test  # val | test


@dataclass
class PredictConfig:
    input: str | None = None  # a folder of images, a glob of images, .bin or TFRecord files
    format: str = "auto"  # auto (by file name) | images | records (.bin) | tfrecord
    output: str | None = None  # the CSV; default: predictions.csv in the run folder
    workers: int = 0  # threads decoding image files; 0: one per core

    def __post_init__(self) -> None:
        formats = ("auto", "images", "records", "tfrecord")
        require(self.format in formats, "predict.format", "auto, images, records or tfrecord", self.format)
        require(self.workers >= 0, "predict.workers", ">= 0 (0: one per core)", self.workers)


@dataclass
class InspectConfig:
    split: Split = Split.train  # train | val | test
    num_images: int = 64  # tiles on the contact sheet
    augmented: bool = False  # show the training augmentation (train split)

    def __post_init__(self) -> None:
        require(self.num_images >= 1, "inspect.num_images", ">= 1", self.num_images)


@dataclass
class ExportConfig:
    dir: str | None = None  # the SavedModel folder (must not exist yet)


@dataclass
class Config:
    dataset: DatasetConfig = MISSING  # dataset=: the data
    model: ModelConfig = MISSING  # model=: the network
    optimizer: OptimizerConfig = MISSING  # optimizer=: the Keras optimizer and its schedule
    strategy: StrategyConfig = MISSING  # strategy=: one device, mirrored or multi-worker
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # epochs, batch, precision, loss options
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # what best.keras and the return value track
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)  # mode=evaluate
    predict: PredictConfig = field(default_factory=PredictConfig)  # mode=predict
    inspect: InspectConfig = field(default_factory=InspectConfig)  # mode=inspect
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)  # the phases of a pretrained base
    export: ExportConfig = field(default_factory=ExportConfig)  # mode=export
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)  # callbacks=: optional Keras callbacks
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # logger=: trackers besides history.csv
    name: str | None = None  # a readable run name: joins the run folder's name, the log, metrics.json, loggers
    tags: list[str] = field(default_factory=list)  # e.g. [baseline, cifar]: same places as name
    mode: Mode = Mode.train  # train | evaluate | predict | inspect | export
    checkpoint: str | None = None  # evaluate/predict: a .keras file or a run folder
    resume: str | None = None  # train: continue the run in this folder (or `latest`) from its backup
    seed: int = 42  # seeds weights, shuffling and augmentation
    output_dir: str = MISSING  # the run folder (Hydra's runtime.output_dir)

    def __post_init__(self) -> None:
        require(0 <= self.seed < 2**32, "seed", "in [0, 2**32)", self.seed)
        smallest, why = MIN_INPUT_SIZES.get(self.model.name, (1, ""))
        if why:
            require(
                self.dataset.input_size >= smallest,
                "dataset.image_size",
                f">= {smallest} for {why} (0 = the stored size; with the crop, "
                f"the model would see {self.dataset.input_size} pixels)",
                self.dataset.image_size,
            )
        if self.mode in ("evaluate", "predict", "export"):
            require(
                bool(self.checkpoint),
                "checkpoint",
                f"a .keras file or run folder with mode={self.mode}",
                self.checkpoint,
            )
        if self.mode == "export":
            require(bool(self.export.dir), "export.dir", "a new folder with mode=export", self.export.dir)
        if self.mode == "predict":
            require(
                bool(self.predict.input),
                "predict.input",
                "a folder, glob or file list with mode=predict",
                self.predict.input,
            )
