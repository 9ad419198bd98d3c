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
import re
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from types import SimpleNamespace
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, MissingMandatoryValue, OmegaConf

from trainer import cluster, folders
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

MIN_VGG_INPUT = 16  # five 2x2 poolings take 16 pixels down to 1 (trainer.models.vgg19.MIN_INPUT_SIZE)


class Choice(str, Enum):
    """An enum-like option: OmegaConf rejects any other value when Hydra composes the config, naming
    the key and the valid choices. Members compare, hash and print as their plain strings."""

    __str__ = str.__str__
    __format__ = str.__format__


Crop = Choice("Crop", {name: name for name in ("random", "pad", "random_resized", "none")})
ValSource = Choice("ValSource", {"train": "train", "test": "test"})
RecordFormat = Choice("RecordFormat", {"raw": "raw", "jpeg": "jpeg"})
ScheduleName = Choice("ScheduleName", {name: name for name in ("constant", "step", "cosine")})
Precision = Choice("Precision", {name: name for name in ("float32", "mixed_float16", "mixed_bfloat16")})
Direction = Choice("Direction", {"max": "max", "min": "min"})
EvaluateSplit = Choice("EvaluateSplit", {"val": "val", "test": "test"})
Split = Choice("Split", {name: name for name in ("train", "val", "test")})
WandbMode = Choice("WandbMode", {name: name for name in ("offline", "online", "disabled")})
Mode = Choice("Mode", {name: name for name in ("train", "evaluate", "predict", "inspect", "export")})


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
    crop: Crop = Crop.none  # random | pad | random_resized | none
    crop_size: int = 0  # random: output size of the crop (0 = image_size)
    padding: int = 4  # pad: pixels added on each side before the random crop
    min_area: float = 0.25  # random_resized: smallest crop as a fraction of the image area
    flip: bool = False  # random horizontal flip (a layer of the model, like the colour jitter)
    brightness: float = 0.0  # max brightness delta on the 0..255 scale; 0 disables
    contrast_lower: float = 1.0  # contrast factor range; 1.0..1.0 disables
    contrast_upper: float = 1.0

    def __post_init__(self) -> None:
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
    val_source: ValSource = ValSource.train  # train: hold out val_size records; test: validate on the test files
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
    format: RecordFormat = RecordFormat.raw  # raw (label + img_raw pixels) | jpeg (image/encoded ...)
    stored_size: int = 224  # raw: side of the stored images
    image_key: str | None = None  # feature keys; null: the format's defaults
    label_key: str | None = None
    filename_key: str | None = None
    compression: str = "auto"  # auto (from each file's first bytes) | none | gzip | zlib
    num_classes: int = 2
    class_names: list[str] = field(default_factory=lambda: ["cat", "dog"])  # the manifest's win when present
    image_size: int = 224  # model input side
    shuffle_buffer: int = 1000  # records held for shuffling
    standardize: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _require(
            self.compression in ("auto", "none", "gzip", "zlib"),
            "dataset.compression",
            "auto, none, gzip or zlib",
            self.compression,
        )
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


def _check_head(model: Any) -> None:
    """The classifier-head keys both VGG19 models share."""
    _require(model.fc_units >= 1, "model.fc_units", ">= 1", model.fc_units)
    _require(0 <= model.dropout < 1, "model.dropout", "in [0, 1)", model.dropout)
    _require(model.weight_decay >= 0, "model.weight_decay", ">= 0", model.weight_decay)


@dataclass
class VGG19Config:
    _target_: str = "trainer.models.vgg19.build_vgg19"  # called with num_classes, input_shape and the keys below
    name: str = "vgg19"
    width_multiplier: float = 1.0  # scales every layer's channels; 0.125 for tiny test models
    fc_units: int = 512  # units of fc1 and fc2 before width scaling
    dropout: float = 0.5  # after fc1 and fc2; 0 disables
    weight_decay: float = 5e-4  # L2 on every conv and dense kernel
    batch_norm: bool = True  # batch normalization after each convolution (VGG19 from scratch barely learns without)
    batch_norm_momentum: float = 0.9  # moving statistics; Keras's 0.99 lags behind in short runs

    def __post_init__(self) -> None:
        _require(0 < self.width_multiplier <= 4, "model.width_multiplier", "in (0, 4]", self.width_multiplier)
        _check_head(self)
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
        _require(0 <= self.batch_norm_momentum < 1, "model.batch_norm_momentum", "in [0, 1)", self.batch_norm_momentum)


@dataclass
class VGG19ImageNetConfig:
    _target_: str = "trainer.models.finetune.build_vgg19_imagenet"
    name: str = "vgg19_imagenet"
    weights: str | None = "imagenet"  # imagenet (Keras downloads and caches) | a local .h5/.weights.h5 | null
    fc_units: int = 256  # the new head's hidden layer
    dropout: float = 0.5  # before the classifier; off at evaluation
    weight_decay: float = 1e-4  # L2 on the new head's kernels
    preprocessing: str = "caffe"  # what the ImageNet weights expect: BGR, mean-subtracted

    def __post_init__(self) -> None:
        _check_head(self)
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
    name: ScheduleName = ScheduleName.constant  # constant | step | cosine
    warmup_epochs: float = 0.0  # cosine: linear warmup from 0 to optimizer.lr
    boundaries: list[float] = field(default_factory=list)  # step: epochs at which lr is multiplied by factor
    factor: float = 0.1  # step: multiplier at each boundary
    alpha: float = 0.0  # cosine: final lr as a fraction of optimizer.lr

    def __post_init__(self) -> None:
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
    lr_batch_size: int | None = None  # the global batch lr is tuned for: batch B trains at lr x B / lr_batch_size
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optimizer.lr", "> 0", self.lr)
        _require(0 <= self.momentum < 1, "optimizer.momentum", "in [0, 1)", self.momentum)
        _require(self.weight_decay >= 0, "optimizer.weight_decay", ">= 0", self.weight_decay)
        _require(self.clipnorm is None or self.clipnorm > 0, "optimizer.clipnorm", "> 0 or null", self.clipnorm)
        _require(
            self.lr_batch_size is None or self.lr_batch_size >= 1,
            "optimizer.lr_batch_size",
            ">= 1 or null",
            self.lr_batch_size,
        )
        _require(
            not (self.lr_batch_size and self.scale_with_replicas),
            "optimizer.lr_batch_size",
            "null when optimizer.scale_with_replicas=true (both scale lr)",
            self.lr_batch_size,
        )


@dataclass
class SingleStrategyConfig:
    name: str = "single"
    device: str | None = None  # e.g. "/gpu:1" (a OneDeviceStrategy); default: no strategy, first GPU else CPU


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


def _class_weight_option(value: Any) -> str | dict[int, float] | None:
    """null/none, `balanced`, or a {class index: weight > 0} mapping, checked."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    if isinstance(value, str) and value.lower() == "balanced":
        return "balanced"
    expected = "null, balanced or a mapping {class index: weight > 0}, e.g. {0: 1.0, 1: 3.0}"
    _require(isinstance(value, dict) and bool(value), "trainer.class_weight", expected, value)
    weights = {}
    for key, weight in value.items():
        try:
            index, weight = int(key), float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"trainer.class_weight must be {expected}; got {value!r}") from None
        _require(index >= 0 and weight > 0, "trainer.class_weight", expected, value)
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
        self.jit_compile = str(self.jit_compile).lower()
        _require(
            self.jit_compile in ("auto", "true", "false"),
            "trainer.jit_compile",
            "auto, true or false",
            self.jit_compile,
        )
        _require(self.steps_per_execution >= 1, "trainer.steps_per_execution", ">= 1", self.steps_per_execution)
        _require(0 <= self.label_smoothing < 1, "trainer.label_smoothing", "in [0, 1)", self.label_smoothing)
        self.class_weight = _class_weight_option(self.class_weight)
        _require(
            self.save_every_steps is None or self.save_every_steps >= 1,
            "trainer.save_every_steps",
            ">= 1 or null",
            self.save_every_steps,
        )


@dataclass
class EarlyStoppingConfig:
    monitor: str = "${objective.metric}"  # a column of history.csv
    mode: Direction = "${objective.mode}"  # max | min
    patience: int = 5  # epochs without improvement before stopping
    min_delta: float = 0.0  # a smaller change is no improvement
    restore_best_weights: bool = True  # end with the best epoch's weights (best.keras holds them anyway)

    def __post_init__(self) -> None:
        _require(self.patience >= 0, "callbacks.early_stopping.patience", ">= 0", self.patience)
        _require(self.min_delta >= 0, "callbacks.early_stopping.min_delta", ">= 0", self.min_delta)


@dataclass
class ReduceLROnPlateauConfig:
    monitor: str = "${objective.metric}"
    mode: Direction = "${objective.mode}"  # max | min
    factor: float = 0.1  # new lr = lr x factor
    patience: int = 3  # epochs without improvement before reducing
    min_delta: float = 0.0
    min_lr: float = 0.0  # never below this

    def __post_init__(self) -> None:
        key = "callbacks.reduce_lr_on_plateau"
        _require(0 < self.factor < 1, f"{key}.factor", "in (0, 1)", self.factor)
        _require(self.patience >= 0, f"{key}.patience", ">= 0", self.patience)
        _require(self.min_lr >= 0, f"{key}.min_lr", ">= 0", self.min_lr)


@dataclass
class CallbacksConfig:
    """Optional Keras callbacks: `callbacks=early_stopping`, `callbacks=[early_stopping,reduce_lr_on_plateau]`."""

    early_stopping: EarlyStoppingConfig | None = None
    reduce_lr_on_plateau: ReduceLROnPlateauConfig | None = None


@dataclass
class LoggerConfig:
    """Where metrics go besides history.csv: `logger=mlflow`, `logger=[tensorboard,wandb]`, `logger=many`."""

    tensorboard: bool = False  # tensorboard/ in the run folder: scalars, lr, sample images
    csv: bool = False  # history.csv only (always written: resuming and curves.png read it)
    mlflow: bool = False
    wandb: bool = False
    experiment: str = "vggtrain"  # MLflow experiment / W&B project
    tracking_uri: str | None = None  # MLflow: null = sqlite:///<launch folder>/outputs/mlflow.db; http://host:port
    timeout_seconds: float = 10.0  # MLflow server: start-up reachability check and each request
    wandb_mode: WandbMode = WandbMode.offline  # offline (no account needed; `wandb sync` later) | online | disabled
    wandb_entity: str | None = None  # W&B team or user (online)

    def __post_init__(self) -> None:
        _require(self.timeout_seconds > 0, "logger.timeout_seconds", "> 0", self.timeout_seconds)


@dataclass
class ObjectiveConfig:
    metric: str = "val_accuracy"  # a metric name from history.csv
    mode: Direction = Direction.max  # max | min


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
        _require(self.format in formats, "predict.format", "auto, images, records or tfrecord", self.format)
        _require(self.workers >= 0, "predict.workers", ">= 0 (0: one per core)", self.workers)


@dataclass
class InspectConfig:
    split: Split = Split.train  # train | val | test
    num_images: int = 64  # tiles on the contact sheet
    augmented: bool = False  # show the training augmentation (train split)

    def __post_init__(self) -> None:
        _require(self.num_images >= 1, "inspect.num_images", ">= 1", self.num_images)


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
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    name: str | None = None  # a readable run name: joins the run folder's name, the log, metrics.json, loggers
    tags: list[str] = field(default_factory=list)  # e.g. [baseline, cifar]: same places as name
    mode: Mode = Mode.train  # train | evaluate | predict | inspect | export
    checkpoint: str | None = None  # evaluate/predict: a .keras file or a run folder
    resume: str | None = None  # train: continue the run in this folder (or `latest`) from its backup
    seed: int = 42  # seeds weights, shuffling and augmentation
    output_dir: str = MISSING  # the run folder (Hydra's runtime.output_dir)

    def __post_init__(self) -> None:
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


# A custom model's keys are the user's: no fixed fields, and `model.<any key>=...` may add one (not struct).
CUSTOM_MODEL = {"_target_": MISSING, "name": "custom", "preprocessing": None}

# Stored as `hydra/schema/<group>/<name>` and pulled into an option file with
# `- /hydra/schema/<group>/<name>@_here_`: Hydra's --help lists only groups outside hydra/,
# so `dataset=binary_schema` is no longer offered as a choice.
SCHEMA_GROUP = "hydra/schema"


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


def worker_dir(path: str, resume: str | None = None, *, _root_: DictConfig) -> str:
    """The run folder for the chief (and outside multi-worker runs), else a fresh temporary folder.

    Used as `hydra.run.dir: ${worker_dir:PATH,${resume}}`, so only the chief writes into `outputs/`.
    The chief's folder is `resume`'s run folder when resuming, else a new folder claimed at PATH
    (PATH-2, PATH-3... when a run started in the same second has it).
    """
    strategy = _root_.get("strategy") or {}
    if strategy.get("name") == "multi_worker":
        role = cluster.worker_role(strategy.get("cluster", "auto"), strategy.get("workers"), strategy.get("task_index"))
        if not role.is_chief:
            return _temporary_folder(path)
    return folders.resume_folder(resume) if resume else folders.claim_new_folder(path)


def run_label(*, _root_: DictConfig) -> str:
    """`_NAME_TAG1-TAG2` from `name=` and `tags=` for the run folder's name (characters outside
    [A-Za-z0-9.-] become -), or '' without them. Used as `${run_label:}` in `hydra.run.dir`."""
    name, tags = _root_.get("name"), _root_.get("tags")
    parts = [name or "", "-".join(str(tag) for tag in (tags or []))]
    label = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", part).strip("-") for part in parts if part)
    return f"_{label[:80]}" if label else ""


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
            store.store(group=f"{SCHEMA_GROUP}/{group}", name=name, node=node)
    custom = OmegaConf.create(CUSTOM_MODEL, flags={"struct": False})
    store.store(group=f"{SCHEMA_GROUP}/model", name="custom_schema", node=custom)
    if not OmegaConf.has_resolver("bundled"):
        OmegaConf.register_new_resolver("bundled", bundled_data)
        OmegaConf.register_new_resolver("optuna_direction", lambda mode: {"max": "maximize"}.get(mode, "minimize"))
        OmegaConf.register_new_resolver("worker_dir", worker_dir)
    if not OmegaConf.has_resolver("new_folder"):
        OmegaConf.register_new_resolver("new_folder", folders.claim_new_folder, use_cache=True)
        OmegaConf.register_new_resolver("hydra_subdir", folders.hydra_subdir)
    if not OmegaConf.has_resolver("run_label"):
        OmegaConf.register_new_resolver("run_label", run_label)


def to_settings(cfg: DictConfig) -> Config:
    """Resolves the composed config into dataclasses, running every range check."""
    try:
        settings = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as error:  # OmegaConf wraps __post_init__ errors and missing values
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        if isinstance(error, MissingMandatoryValue) and getattr(error, "full_key", None):
            raise ConfigError(f"{error.full_key} must be set; it has no default") from error
        raise ConfigError(str(error).splitlines()[0]) from error
    if isinstance(settings.model, dict):  # model=custom: attribute access like the typed models
        settings.model = SimpleNamespace(**settings.model)
        _require(
            settings.model.preprocessing in (None, "caffe"),
            "model.preprocessing",
            "null (the dataset's normalization) or caffe",
            settings.model.preprocessing,
        )
    return settings
