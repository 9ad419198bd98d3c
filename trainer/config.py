"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML option in `conf/<group>/` starts from one of these schemas (its
defaults list names `<name>_schema`), so an unknown key or a wrong type fails
when Hydra composes the config. Ranges are checked in `__post_init__`, which
runs when `to_settings` turns the composed config into these dataclasses.

    python run.py model.dropout=1.5   # -> error: model.dropout must be in [0, 1)
"""

from __future__ import annotations

import functools
import logging
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from trainer import cluster
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

MIN_VGG_INPUT = 16  # five 2x2 poolings take 16 pixels down to 1 (trainer.models.vgg19.MIN_INPUT_SIZE)


def _require(condition: bool, key: str, expected: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key} must be {expected}; got {value!r}")


def _file_list(value: Any, key: str) -> list[str]:
    """A list of paths or globs from a list or from one string (`dataset.train_files=/data/x_*`)."""
    files = [value] if isinstance(value, str) else list(value or [])
    _require(bool(files) and all(isinstance(f, str) and f for f in files), key, "a glob or a non-empty list", value)
    return files


def _check_crop(augment: AugmentConfig, image_size: int) -> None:
    """A random crop must fit in the (resized) image it is cut from."""
    if augment.crop == "random" and augment.crop_size:
        _require(
            augment.crop_size <= image_size,
            "dataset.augment.crop_size",
            f"<= the {image_size}-pixel image it is cut from (dataset.image_size)",
            augment.crop_size,
        )


@dataclass
class AugmentConfig:
    crop: str = "none"  # random | pad | random_resized | none
    crop_size: int = 0  # random: output size of the crop (0 = image_size)
    padding: int = 4  # pad: pixels added on each side before the random crop
    min_area: float = 0.25  # random_resized: smallest crop as a fraction of the image area
    flip: bool = False  # random horizontal flip
    brightness: float = 0.0  # max brightness delta on the 0..255 scale; 0 disables
    contrast_lower: float = 1.0  # contrast factor range; 1.0..1.0 disables
    contrast_upper: float = 1.0

    def __post_init__(self) -> None:
        crops = ("random", "pad", "random_resized", "none")
        _require(self.crop in crops, "dataset.augment.crop", ", ".join(crops), self.crop)
        _require(0 < self.min_area <= 1, "dataset.augment.min_area", "in (0, 1]", self.min_area)
        _require(self.crop_size >= 0, "dataset.augment.crop_size", ">= 0", self.crop_size)
        _require(self.padding >= 0, "dataset.augment.padding", ">= 0", self.padding)
        _require(self.brightness >= 0, "dataset.augment.brightness", ">= 0", self.brightness)
        _require(
            0 < self.contrast_lower <= self.contrast_upper,
            "dataset.augment.contrast_lower",
            "> 0 and <= contrast_upper",
            self.contrast_lower,
        )


@dataclass
class BinaryDatasetConfig:
    """Fixed-length binary records: label bytes, then the pixels channel-first."""

    name: str = MISSING
    data_dir: str = MISSING  # folder holding the files (relative paths resolve against the launch folder)
    train_files: Any = MISSING  # a file name or a list of them
    test_files: Any = MISSING
    search_subdirs: list[str] = field(default_factory=list)  # also look in these folders below data_dir
    height: int = MISSING  # stored image height
    width: int = MISSING
    channels: int = MISSING
    label_bytes: int = 1  # bytes before the pixels (CIFAR-100: 2, coarse then fine)
    label_index: int = 0  # which of those bytes is the label
    num_classes: int = MISSING
    class_names: list[str] = MISSING
    image_size: int = 0  # resize stored images to this before augmentation (0 = stored size)
    val_size: float = 5000  # validation records held out from the end of the training files; < 1: a fraction
    val_source: str = "train"  # train: hold out val_size records; test: validate on the test files
    shuffle_buffer: int = 10000  # records; >= the training set size gives a full shuffle
    cache: bool = False  # keep the decoded images in memory after the first epoch (small datasets)
    standardize: bool = True  # per-image standardization (zero mean, unit variance)
    download: bool = False  # fetch `url` if the files are missing
    url: str | None = None
    md5: str | None = None  # checksum of the archive at `url`
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        for key in ("height", "width", "channels", "label_bytes", "num_classes"):
            _require(getattr(self, key) >= 1, f"dataset.{key}", ">= 1", getattr(self, key))
        _require(self.channels in (1, 3), "dataset.channels", "1 or 3", self.channels)
        _require(self.num_classes <= 256, "dataset.num_classes", "<= 256 (one label byte)", self.num_classes)
        _require(
            0 <= self.label_index < self.label_bytes,
            "dataset.label_index",
            "in [0, label_bytes)",
            self.label_index,
        )
        _require(
            len(self.class_names) == self.num_classes,
            "dataset.class_names",
            f"a list of num_classes={self.num_classes} names",
            list(self.class_names),
        )
        _require(self.image_size >= 0, "dataset.image_size", ">= 0", self.image_size)
        _check_crop(self.augment, self.image_size or self.height)
        _require(
            self.val_size >= 0 and (self.val_size < 1 or float(self.val_size).is_integer()),
            "dataset.val_size",
            "a record count or a fraction in (0, 1)",
            self.val_size,
        )
        if self.val_size >= 1:
            self.val_size = int(self.val_size)
        _require(self.val_source in ("train", "test"), "dataset.val_source", "train or test", self.val_source)
        _require(self.shuffle_buffer >= 1, "dataset.shuffle_buffer", ">= 1", self.shuffle_buffer)
        self.train_files = _file_list(self.train_files, "dataset.train_files")
        self.test_files = _file_list(self.test_files, "dataset.test_files")
        if self.download:
            _require(bool(self.url), "dataset.url", "set when dataset.download=true", self.url)


@dataclass
class TFRecordDatasetConfig:
    """TFRecord shards: the converter's output or the classic Cats-vs-Dogs files."""

    name: str = MISSING
    data_dir: str = "."  # the converter's OUTPUT_DIR; the globs below usually start with it
    train_files: Any = MISSING  # a glob or a list of globs, e.g. ["${dataset.data_dir}/train.tfrecords_*"]
    val_files: Any = MISSING
    test_files: Any = MISSING
    format: str = "raw"  # raw (label + img_raw pixels) | jpeg (image/encoded ...)
    stored_size: int = 224  # raw: side of the stored images
    image_key: str | None = None  # feature keys; null: the format's defaults
    label_key: str | None = None
    filename_key: str | None = None
    num_classes: int = 2
    class_names: list[str] = field(default_factory=lambda: ["cat", "dog"])  # the manifest's win when present
    image_size: int = 224  # model input side
    shuffle_buffer: int = 1000  # records held for shuffling
    standardize: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _require(self.format in ("raw", "jpeg"), "dataset.format", "raw or jpeg", self.format)
        for key in ("stored_size", "image_size", "shuffle_buffer"):
            _require(getattr(self, key) >= 1, f"dataset.{key}", ">= 1", getattr(self, key))
        _require(self.num_classes >= 2, "dataset.num_classes", ">= 2", self.num_classes)
        _require(
            len(self.class_names) == self.num_classes,
            "dataset.class_names",
            f"a list of num_classes={self.num_classes} names",
            list(self.class_names),
        )
        for key in ("train_files", "val_files", "test_files"):
            setattr(self, key, _file_list(getattr(self, key), f"dataset.{key}"))
        _check_crop(self.augment, self.image_size)


@dataclass
class VGG19Config:
    name: str = "vgg19"
    width_multiplier: float = 1.0  # scales every layer's channels; 0.125 for tiny test models
    fc_units: int = 512  # units of fc1 and fc2 before width scaling
    dropout: float = 0.5  # after fc1 and fc2; 0 disables
    weight_decay: float = 5e-4  # L2 on every conv and dense kernel
    batch_norm: bool = True  # batch normalization after each convolution (VGG19 from scratch barely learns without)
    batch_norm_momentum: float = 0.9  # moving statistics; Keras's 0.99 lags behind in short runs

    def __post_init__(self) -> None:
        _require(0 < self.width_multiplier <= 4, "model.width_multiplier", "in (0, 4]", self.width_multiplier)
        _require(
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
        _require(self.fc_units >= 1, "model.fc_units", ">= 1", self.fc_units)
        _require(0 <= self.dropout < 1, "model.dropout", "in [0, 1)", self.dropout)
        _require(self.weight_decay >= 0, "model.weight_decay", ">= 0", self.weight_decay)
        _require(0 <= self.batch_norm_momentum < 1, "model.batch_norm_momentum", "in [0, 1)", self.batch_norm_momentum)


@dataclass
class VGG19ImageNetConfig:
    name: str = "vgg19_imagenet"
    weights: str | None = "imagenet"  # imagenet (Keras downloads and caches) | a local .h5/.weights.h5 | null
    fc_units: int = 256  # the new head's hidden layer
    dropout: float = 0.5  # before the classifier; off at evaluation
    weight_decay: float = 1e-4  # L2 on the new head's kernels
    preprocessing: str = "caffe"  # what the ImageNet weights expect: BGR, mean-subtracted

    def __post_init__(self) -> None:
        _require(self.fc_units >= 1, "model.fc_units", ">= 1", self.fc_units)
        _require(0 <= self.dropout < 1, "model.dropout", "in [0, 1)", self.dropout)
        _require(self.weight_decay >= 0, "model.weight_decay", ">= 0", self.weight_decay)
        _require(self.preprocessing == "caffe", "model.preprocessing", "caffe (the weights fix it)", self.preprocessing)


@dataclass
class FinetuneConfig:
    freeze_epochs: int = 0  # phase 1: epochs training the head with the whole base frozen
    unfreeze_from: str = "block5_conv1"  # phase 2: base layers from this one on train too (or `all`)
    lr_multiplier: float = 0.1  # phase 2 learning rate = optimizer.lr x this

    def __post_init__(self) -> None:
        _require(self.freeze_epochs >= 0, "finetune.freeze_epochs", ">= 0", self.freeze_epochs)
        _require(0 < self.lr_multiplier <= 1, "finetune.lr_multiplier", "in (0, 1]", self.lr_multiplier)


@dataclass
class ExportConfig:
    dir: str | None = None  # the SavedModel folder (must not exist yet)


@dataclass
class ScheduleConfig:
    name: str = "constant"  # constant | step | cosine
    warmup_epochs: float = 0.0  # cosine: linear warmup from 0 to optimizer.lr
    boundaries: list[float] = field(default_factory=list)  # step: epochs at which lr is multiplied by factor
    factor: float = 0.1  # step: multiplier at each boundary
    alpha: float = 0.0  # cosine: final lr as a fraction of optimizer.lr

    def __post_init__(self) -> None:
        names = ("constant", "step", "cosine")
        _require(self.name in names, "optimizer.schedule.name", " or ".join(names), self.name)
        _require(self.warmup_epochs >= 0, "optimizer.schedule.warmup_epochs", ">= 0", self.warmup_epochs)
        _require(self.factor > 0, "optimizer.schedule.factor", "> 0", self.factor)
        _require(
            list(self.boundaries) == sorted(self.boundaries) and all(b > 0 for b in self.boundaries),
            "optimizer.schedule.boundaries",
            "increasing positive epochs",
            list(self.boundaries),
        )
        _require(0 <= self.alpha <= 1, "optimizer.schedule.alpha", "in [0, 1]", self.alpha)


@dataclass
class OptimizerConfig:
    name: str = MISSING  # sgd | adam | adamw
    lr: float = 0.01  # peak learning rate
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    weight_decay: float = 0.0  # adamw only: decoupled weight decay
    clipnorm: float | None = None  # clip each gradient to this norm
    scale_with_replicas: bool = False  # multiply lr by the number of replicas (linear scaling rule)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optimizer.lr", "> 0", self.lr)
        _require(0 <= self.momentum < 1, "optimizer.momentum", "in [0, 1)", self.momentum)
        _require(self.weight_decay >= 0, "optimizer.weight_decay", ">= 0", self.weight_decay)
        _require(self.clipnorm is None or self.clipnorm > 0, "optimizer.clipnorm", "> 0 or null", self.clipnorm)


@dataclass
class SingleStrategyConfig:
    name: str = "single"
    device: str | None = None  # e.g. "/gpu:1"; default: first GPU, else CPU


@dataclass
class MirroredStrategyConfig:
    name: str = "mirrored"
    devices: list[str] | None = None  # default: all GPUs
    cpu_devices: int = 0  # > 0 splits the CPU into this many logical devices instead

    def __post_init__(self) -> None:
        _require(self.cpu_devices >= 0, "strategy.cpu_devices", ">= 0", self.cpu_devices)


@dataclass
class MultiWorkerStrategyConfig:
    name: str = "multi_worker"
    cluster: str = "auto"  # auto | tf_config | workers | slurm
    workers: list[str] | None = None  # host:port of every worker, same order on all of them
    task_index: int | None = None  # this worker's position in `workers`
    timeout_seconds: float = 600.0  # a collective waiting longer (a worker died) fails the run

    def __post_init__(self) -> None:
        _require(self.timeout_seconds > 0, "strategy.timeout_seconds", "> 0", self.timeout_seconds)


@dataclass
class TrainerConfig:
    epochs: int = 30  # passes over the training split
    batch_size: int = 128  # global batch size, summed over replicas
    steps_per_epoch: int | None = None  # default: training records // batch_size
    verbose: int = 1  # one line per epoch; 1: plus a progress bar within epochs on a terminal (0, 2: none)
    threads: int = 0  # TensorFlow intra-op threads; 0: TensorFlow's default (all cores)
    save_every_steps: int | None = None  # also back up every N steps, not only at epoch ends
    deterministic: bool = False  # TensorFlow op determinism: identical weights run to run, slower
    precision: str = "float32"  # float32 | mixed_float16 | mixed_bfloat16
    jit_compile: str = "auto"  # auto | true | false (XLA; with a strategy, Keras's auto means off)
    steps_per_execution: int = 1  # training steps run per call into TensorFlow
    tf_logs: bool = False  # true: TensorFlow's own start-up and INFO logs too (cuInit, oneDNN, absl, ...)

    def __post_init__(self) -> None:
        _require(self.epochs >= 1, "trainer.epochs", ">= 1", self.epochs)
        _require(self.batch_size >= 1, "trainer.batch_size", ">= 1", self.batch_size)
        _require(
            self.steps_per_epoch is None or self.steps_per_epoch >= 1,
            "trainer.steps_per_epoch",
            ">= 1 or null",
            self.steps_per_epoch,
        )
        _require(self.verbose in (0, 1, 2), "trainer.verbose", "0, 1 or 2", self.verbose)
        _require(self.threads >= 0, "trainer.threads", ">= 0", self.threads)
        precisions = ("float32", "mixed_float16", "mixed_bfloat16")
        _require(self.precision in precisions, "trainer.precision", " or ".join(precisions), self.precision)
        self.jit_compile = str(self.jit_compile).lower()
        _require(
            self.jit_compile in ("auto", "true", "false"),
            "trainer.jit_compile",
            "auto, true or false",
            self.jit_compile,
        )
        _require(self.steps_per_execution >= 1, "trainer.steps_per_execution", ">= 1", self.steps_per_execution)
        _require(
            self.save_every_steps is None or self.save_every_steps >= 1,
            "trainer.save_every_steps",
            ">= 1 or null",
            self.save_every_steps,
        )


@dataclass
class ObjectiveConfig:
    metric: str = "val_accuracy"  # a metric name from history.csv
    mode: str = "max"  # max | min

    def __post_init__(self) -> None:
        _require(self.mode in ("max", "min"), "objective.mode", "max or min", self.mode)


@dataclass
class EvaluateConfig:
    split: str = "test"  # val | test

    def __post_init__(self) -> None:
        _require(self.split in ("val", "test"), "evaluate.split", "val or test", self.split)


@dataclass
class PredictConfig:
    input: str | None = None  # a folder of images, a glob of images, .bin or TFRecord files
    output: str | None = None  # the CSV; default: predictions.csv in the run folder
    workers: int = 0  # threads decoding image files; 0: one per core

    def __post_init__(self) -> None:
        _require(self.workers >= 0, "predict.workers", ">= 0 (0: one per core)", self.workers)


@dataclass
class InspectConfig:
    split: str = "train"  # train | val | test
    num_images: int = 64  # tiles on the contact sheet
    augmented: bool = False  # show the training augmentation (train split)

    def __post_init__(self) -> None:
        _require(self.split in ("train", "val", "test"), "inspect.split", "train, val or test", self.split)
        _require(self.num_images >= 1, "inspect.num_images", ">= 1", self.num_images)


MODES = ("train", "evaluate", "predict", "inspect", "export")


@dataclass
class Config:
    dataset: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    strategy: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    mode: str = "train"  # train | evaluate | predict | inspect | export
    checkpoint: str | None = None  # evaluate/predict: a .keras file or a run folder
    resume: str | None = None  # train: continue the run in this folder (or `latest`) from its backup
    seed: int = 42  # seeds weights, shuffling and augmentation
    output_dir: str = MISSING  # the run folder (Hydra's runtime.output_dir)

    def __post_init__(self) -> None:
        _require(self.mode in MODES, "mode", " or ".join(MODES), self.mode)
        _require(0 <= self.seed < 2**32, "seed", "in [0, 2**32)", self.seed)
        if getattr(self.model, "name", None) in ("vgg19", "vgg19_imagenet"):
            _require(
                model_input_size(self.dataset) >= MIN_VGG_INPUT,
                "dataset.image_size",
                f">= {MIN_VGG_INPUT} for VGG19's five poolings (0 = the stored size; with the crop, "
                f"the model would see {model_input_size(self.dataset)} pixels)",
                self.dataset.image_size,
            )
        if self.mode in ("evaluate", "predict", "export"):
            _require(
                bool(self.checkpoint),
                "checkpoint",
                f"a .keras file or run folder with mode={self.mode}",
                self.checkpoint,
            )
        if self.mode == "export":
            _require(bool(self.export.dir), "export.dir", "a new folder with mode=export", self.export.dir)
        if self.mode == "predict":
            _require(
                bool(self.predict.input),
                "predict.input",
                "a folder, glob or file list with mode=predict",
                self.predict.input,
            )


def model_input_size(dataset: BinaryDatasetConfig | TFRecordDatasetConfig) -> int:
    """Side of the square images the model sees: the crop if any, else the resized (or stored) size."""
    augment = dataset.augment
    if augment.crop == "random" and augment.crop_size:
        return augment.crop_size
    return dataset.image_size or getattr(dataset, "height", 0)


SCHEMAS = {
    "dataset": {"binary_schema": BinaryDatasetConfig, "tfrecord_schema": TFRecordDatasetConfig},
    "model": {"vgg19_schema": VGG19Config, "vgg19_imagenet_schema": VGG19ImageNetConfig},
    "optimizer": {"optimizer_schema": OptimizerConfig},
    "strategy": {
        "single_schema": SingleStrategyConfig,
        "mirrored_schema": MirroredStrategyConfig,
        "multi_worker_schema": MultiWorkerStrategyConfig,
    },
}


def bundled_data(name: str) -> str:
    """Path of a dataset shipped inside the package, for `${bundled:digits}` in YAML."""
    return str(resources.files("trainer.data") / name)


def worker_dir(path: str, *, _root_: DictConfig) -> str:
    """`path` for the chief (and outside multi-worker runs), else a fresh temporary folder.

    Used as `hydra.run.dir: ${worker_dir:...}`, so only the chief writes into `outputs/`.
    """
    strategy = _root_.get("strategy") or {}
    if strategy.get("name") != "multi_worker":
        return path
    role = cluster.worker_role(strategy.get("cluster", "auto"), strategy.get("workers"), strategy.get("task_index"))
    return path if role.is_chief else _temporary_folder(path)


@functools.cache
def _temporary_folder(path: str) -> str:
    """One temporary folder per run path and process, however often Hydra resolves it."""
    return tempfile.mkdtemp(prefix=cluster.WORKER_PREFIX)


def register() -> None:
    """Stores the schemas and the resolvers; safe to call twice."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            store.store(group=group, name=name, node=node)
    if not OmegaConf.has_resolver("bundled"):
        OmegaConf.register_new_resolver("bundled", bundled_data)
        OmegaConf.register_new_resolver("optuna_direction", lambda mode: {"max": "maximize"}.get(mode, "minimize"))
        OmegaConf.register_new_resolver("worker_dir", worker_dir)


def to_settings(cfg: DictConfig) -> Config:
    """Resolves the composed config into dataclasses, running every range check."""
    try:
        return OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as error:  # OmegaConf wraps __post_init__ errors and missing values
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(str(error).splitlines()[0]) from error
