"""The schemas of the config groups with options: `model=`, `optimizer=`, `strategy=` (`dataset=`'s are its
formats, `trainer.data.formats`).

    python run.py dataset=cifar model=vgg19 optimizer=sgd strategy=mirrored

Each group has a base schema that `Config` types the section with; each option file of
`conf/<group>/` starts from a subclass (its `/hydra/schema/<group>/<name>`), so an unknown
key or a wrong type fails when Hydra composes the config. The model, optimizer and strategy
name their builder in `_target_`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from trainer.config.fields import ClusterSource, ScheduleName
from trainer.fields import require
from trainer.models import IMAGENET_VGG19_MIN_INPUT, VGG19_MIN_INPUT

log = logging.getLogger(__name__)


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
