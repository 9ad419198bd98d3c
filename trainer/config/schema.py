"""The typed schema of the whole config: `Config`, and the sections without options of their own.

Each default and its meaning live in one place: here, or for the groups with options
(`model=`, `optimizer=`, `strategy=`) in `trainer.config.groups`, `dataset=`'s in `trainer.data.formats`. Ranges are
checked in `__post_init__`, which runs when `trainer.config.to_settings` turns the composed
config into these dataclasses. The parts a run builds (model, optimizer, strategy,
callbacks, trackers) name their builder in `_target_`, and the task layer builds them
with `hydra.utils.instantiate`.

    python run.py model.dropout=1.5   # -> error: model.dropout must be in [0, 1); got 1.5
    python run.py --cfg job           # every key with its value
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from trainer.config.fields import (
    Direction,
    EvaluateSplit,
    ExportFormat,
    JitCompile,
    Mode,
    Precision,
    PredictFormat,
    Quantize,
    Split,
    TestTimeAugmentation,
    Verbosity,
    WandbMode,
)
from trainer.config.groups import ModelConfig, OptimizerConfig, StrategyConfig
from trainer.data.formats.base import DatasetConfig, PhotoConfig
from trainer.errors import ConfigError
from trainer.fields import check_prune_metric, chosen, duration_seconds, require

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: a larger weight is inf in the loss


def _class_weight_option(value: Any) -> str | dict[int, float] | None:
    """null/none, `balanced`, or a {class index: weight > 0} mapping, checked."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    if isinstance(value, str) and value.lower() == "balanced":
        return "balanced"
    expected = "null, balanced or a mapping {class index: finite weight > 0}, e.g. {0: 1.0, 1: 3.0}"
    require(isinstance(value, dict) and bool(value), "trainer.class_weight", expected, value)
    weights = {}
    for key, weight in value.items():
        try:
            index, weight = int(key), float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"trainer.class_weight must be {expected}; got {value!r}") from None
        # finite in float32, the loss's type: an infinite weight made the first step's loss inf, which the
        # divergence guard blamed on the learning rate
        require(index >= 0 and weight > 0 and FLOAT32_MAX >= weight, "trainer.class_weight", expected, value)
        weights[index] = weight
    return weights


@dataclass
class TrainerConfig:
    epochs: int = 30  # passes over the training split
    batch_size: int = 128  # global batch size, summed over replicas
    steps_per_epoch: int | None = None  # default: training records // batch_size
    verbose: Verbosity = Verbosity["1"]  # one line per epoch; 1: plus a progress bar on a terminal (0, 2: none)
    threads: int = 0  # TensorFlow intra-op threads; 0: TensorFlow's default (all cores)
    save_every_steps: int | None = None  # also back up every N steps, not only at epoch ends
    time_budget: str | None = None  # e.g. 2h30m: stop, saved, before the next epoch would not fit (Slurm --time)
    validate: bool = True  # false: no validation in fit (an evaluator beside training does it); objective on train
    deterministic: bool = False  # TensorFlow op determinism: identical weights run to run, slower
    precision: Precision = Precision.auto  # auto (for hardware and model) | float32 | mixed_float16 | mixed_bfloat16
    jit_compile: str = "auto"  # auto | true | false (XLA; with a strategy, Keras's auto means off)
    steps_per_execution: int = 1  # training steps run per call into TensorFlow
    grad_accum_steps: int = 1  # average the gradients of N batches per update: an effective batch N x batch_size
    label_smoothing: float = 0.0  # targets become (1 - s) one-hot + s / num_classes
    class_weight: Any = None  # null | balanced (n / (classes x n_class), from the training split) | {0: w, ...}
    tf_logs: bool = False  # true: TensorFlow's own start-up and INFO logs too (cuInit, oneDNN, absl, ...)
    check_memory: bool = True  # refuse a run whose memory estimate is above what the machine has (false: warn)

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "trainer.epochs", ">= 1", self.epochs)
        require(self.batch_size >= 1, "trainer.batch_size", ">= 1", self.batch_size)
        require(
            self.steps_per_epoch is None or self.steps_per_epoch >= 1,
            "trainer.steps_per_epoch",
            ">= 1 or null",
            self.steps_per_epoch,
        )
        self.verbose = int(chosen(Verbosity, self.verbose, "trainer.verbose"))  # Keras's verbose takes the number
        require(self.threads >= 0, "trainer.threads", ">= 0", self.threads)
        self.jit_compile = chosen(JitCompile, self.jit_compile, "trainer.jit_compile")
        require(self.steps_per_execution >= 1, "trainer.steps_per_execution", ">= 1", self.steps_per_execution)
        require(self.grad_accum_steps >= 1, "trainer.grad_accum_steps", ">= 1 (1: off)", self.grad_accum_steps)
        require(0 <= self.label_smoothing < 1, "trainer.label_smoothing", "in [0, 1)", self.label_smoothing)
        self.class_weight = _class_weight_option(self.class_weight)
        duration_seconds(self.time_budget, "trainer.time_budget")
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
    _target_: str = "trainer.tracking.tensorboard.TensorBoard"  # keras.callbacks.TensorBoard, epochs from 1; called
    # with log_dir and the keys below
    log_dir: str | None = None  # null: RUN/tensorboard, or AIP_TENSORBOARD_LOG_DIR where Vertex AI sets it; any
    # tf.io.gfile folder (gs://...)
    write_graph: bool = False  # the model's graph too (large for VGG19)
    update_freq: str = "epoch"  # epoch, or a number of steps between writes


@dataclass
class MLflowConfig:
    _target_: str = "trainer.tracking.loggers.MLflowTracker"  # the tracker
    tracking_uri: str | None = "${logger.tracking_uri}"  # the store (logger.tracking_uri)
    experiment: str = "${logger.experiment}"  # the experiment (logger.experiment)
    timeout_seconds: float = "${logger.timeout_seconds}"  # a server's reachability check and requests
    register_model: str | None = "${logger.register_model}"  # registers best.keras's MLflow Model under this name


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
    mlflow: MLflowConfig | None = None  # logger=mlflow: params, metrics and the run's files in MLflow
    wandb: WandbConfig | None = None  # logger=wandb: the same in Weights & Biases
    experiment: str = "vggtrain"  # MLflow experiment / W&B project
    tracking_uri: str | None = None  # MLflow: null = sqlite:///<launch folder>/outputs/mlflow.db; http://host:port
    timeout_seconds: float = 10.0  # MLflow server: start-up reachability check and each request
    register_model: str | None = None  # MLflow: register the run's model (best.keras) under this name
    wandb_mode: WandbMode = WandbMode.offline  # offline (no account needed; `wandb sync` later) | online | disabled
    wandb_entity: str | None = None  # W&B team or user (online)

    def __post_init__(self) -> None:
        require(self.timeout_seconds > 0, "logger.timeout_seconds", "> 0", self.timeout_seconds)


# --- the other sections ---------------------------------------------------------------------------------------


@dataclass
class ObjectiveConfig:
    metric: str = "val_accuracy"  # a metric name from history.csv
    mode: Direction = Direction.max  # max | min
    tolerance: float = 0.0  # a later epoch within this of the best value takes its place (a small val split's noise)
    metrics: list[str] | None = None  # a search's objectives, one per hydra.sweeper.directions (e.g. latency_ms)
    prune_metric: str | None = None  # what a search's pruner is told each epoch (null: metric), in mode's direction

    def __post_init__(self) -> None:
        require(self.tolerance >= 0, "objective.tolerance", ">= 0", self.tolerance)
        check_prune_metric(self.prune_metric, self.mode)


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
    tta: TestTimeAugmentation = TestTimeAugmentation.none  # none | flip: mean probabilities of image and mirror
    watch: bool = False  # with checkpoint=RUN: evaluate each epoch the run commits, beside it, until it ends
    watch_timeout: float = 3600.0  # watch: stop after this many seconds without a new epoch
    top_k: int = 5  # top-k accuracy with k = min(top_k, classes - 1), above 2 classes; 0: none
    report: bool = True  # report/ in the run folder: per-class figures, mistakes with Grad-CAM, calibration
    report_images: int = 16  # report: tiles on the mistakes and borderline sheets
    cam_layer: str | None = None  # report: the 4-D layer Grad-CAM reads; null: the last convolution block's

    def __post_init__(self) -> None:
        require(self.top_k >= 0, "evaluate.top_k", ">= 0 (0: no top-k accuracy)", self.top_k)
        require(
            self.report_images >= 1, "evaluate.report_images", ">= 1 (or evaluate.report=false)", self.report_images
        )
        require(self.watch_timeout > 0, "evaluate.watch_timeout", "> 0 (seconds)", self.watch_timeout)


@dataclass
class PredictConfig:
    input: str | None = None  # a folder of images, a glob of images, .bin or TFRecord files
    format: PredictFormat = PredictFormat.auto  # auto (by file name) | images | binary (.bin) | tfrecord | records
    output: str | None = None  # the CSV; default: predictions.csv in the run folder
    workers: int = 0  # image files decoded at once (tf.data); 0: one per core
    tta: TestTimeAugmentation = TestTimeAugmentation.none  # none | flip: mean probabilities of image and mirror
    top_k: int = 0  # also the k most probable classes and their probabilities, in order (top1_class, top1_prob, ...)
    embeddings: bool = False  # also embeddings.npy beside the CSV: each row's L2-normalised penultimate features

    def __post_init__(self) -> None:
        require(self.top_k >= 0, "predict.top_k", ">= 0 (0: none)", self.top_k)
        require(self.workers >= 0, "predict.workers", ">= 0 (0: one per core)", self.workers)
        require(
            not self.embeddings or self.tta == "none",
            "predict.embeddings",
            "false with predict.tta=flip (an embedding is of one image)",
            self.embeddings,
        )


@dataclass
class InspectConfig:
    split: Split = Split.train  # train | val | test
    num_images: int = 64  # tiles on the contact sheet
    augmented: bool = False  # show the training augmentation (train split)
    check: bool = False  # decode every example of every split: bad files, class counts, duplicates, leakage
    allow: list[str] = field(default_factory=list)  # check: accept knowingly: duplicates (leakage, two labels) | bad

    def __post_init__(self) -> None:
        require(self.num_images >= 1, "inspect.num_images", ">= 1", self.num_images)
        unknown = [item for item in self.allow if item not in ("duplicates", "bad")]
        require(not unknown, "inspect.allow", "a list of duplicates, bad", list(self.allow))


@dataclass
class ExportConfig:
    dir: str | None = None  # the export folder (must not exist yet); null: AIP_MODEL_DIR where Vertex AI sets it
    format: ExportFormat = ExportFormat.saved_model  # saved_model | onnx | litert | openvino | all ([export] extra)
    quantize: Quantize = Quantize.none  # litert: also write model_float16.tflite or model_int8.tflite
    check_images: int = 256  # test images the export is checked on against Keras's predict
    calibration_images: int = 300  # training images that calibrate export.quantize=int8
    int8_min_agreement: float = 0.98  # int8: least share of check images whose float top-1 class it keeps
    integer_io: bool = False  # int8: a uint8 output too (its scale in serving_info.json), as edge accelerators take
    embeddings: bool = False  # also the penultimate features, L2-normalised: SavedModel `embed`, a 2nd ONNX output
    max_pixels: int = 89_478_485  # serve_bytes refuses an image larger than this (Pillow's decompression-bomb limit)
    temperature: Any = None  # null: the model's probabilities; auto: fitted on the val split (lowest NLL); or a T > 0

    def __post_init__(self) -> None:
        value = self.temperature
        number = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        require(value is None or value == "auto" or number, "export.temperature", "null, auto or a number > 0", value)
        require(self.check_images >= 1, "export.check_images", ">= 1", self.check_images)
        require(self.max_pixels >= 1, "export.max_pixels", ">= 1", self.max_pixels)
        require(self.calibration_images >= 1, "export.calibration_images", ">= 1", self.calibration_images)
        require(0 <= self.int8_min_agreement <= 1, "export.int8_min_agreement", "in [0, 1]", self.int8_min_agreement)
        require(
            not self.integer_io or self.quantize == "int8",
            "export.integer_io",
            "false unless export.quantize=int8",
            self.integer_io,
        )
        require(
            self.quantize == "none" or self.format in ("litert", "all"),
            "export.quantize",
            f"none unless export.format is litert or all (it is {self.format})",
            str(self.quantize),
        )


@dataclass
class TrialConfig:
    """Set by the vggtrain_optuna sweeper for each job of a search (hparams_search=...); null otherwise."""

    number: int | None = None  # the Optuna trial this job is
    study: str | None = None  # its study's name
    storage: str | None = None  # the study's storage: a journal file or a database URL
    pruner: Any = None  # the study's pruner ({_target_: optuna.pruners.MedianPruner, ...}), or null: no pruning


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
    trial: TrialConfig = field(default_factory=TrialConfig)  # set by a search's sweeper: the trial a job is
    name: str | None = None  # a readable run name: joins the run folder's name, the log, metrics.json, loggers
    tags: list[str] = field(default_factory=list)  # e.g. [baseline, cifar]: same places as name
    mode: Mode = Mode.train  # train | evaluate | predict | inspect | export
    checkpoint: str | None = None  # evaluate/predict: a .keras file or a run folder
    resume: str | None = None  # train: continue the run in this folder (or `latest`) from its backup
    allow_data_change: bool = False  # resume: continue on other data than the run trained on (RUN/data.json)
    seed: int = 42  # seeds weights, shuffling and augmentation
    output_dir: str = MISSING  # the run folder (Hydra's runtime.output_dir)

    def __post_init__(self) -> None:
        require(0 <= self.seed < 2**32, "seed", "in [0, 2**32)", self.seed)
        smallest, why = self.model.MIN_INPUT
        if why:
            stored = "" if isinstance(self.dataset, PhotoConfig) else "0 = the stored size; "  # photos need a size
            require(
                self.dataset.input_size >= smallest,
                "dataset.image_size",
                f">= {smallest} for {why} ({stored}with the crop, the model would see {self.dataset.input_size} "
                f"pixels)",
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
            given = bool(self.export.dir or os.environ.get("AIP_MODEL_DIR"))  # Vertex AI's model folder
            require(given, "export.dir", "a new folder with mode=export (or AIP_MODEL_DIR set)", self.export.dir)
        if self.mode == "predict":
            require(
                bool(self.predict.input),
                "predict.input",
                "a folder, glob or file list with mode=predict",
                self.predict.input,
            )
