"""The parts a run builds from their `_target_` with `hydra.utils.instantiate`: optimizers, strategies, callbacks,
trackers; the typed sections they come from; and `train()`'s steps, each on its own."""

from __future__ import annotations

import keras
import pytest

from conftest import cifar_overrides, compose
from trainer.config import to_settings
from trainer.errors import ConfigError
from trainer.tasks import parts
from trainer.tasks.runtime import build_strategy
from trainer.tracking.loggers import MLflowTracker
from trainer.tracking.tensorboard import TensorBoard
from trainer.training.optimizers import build_optimizer


@pytest.mark.unit
def test_your_own_callback_is_built_from_its_target(tmp_path):
    target = ["+callbacks.csv._target_=keras.callbacks.CSVLogger", f"+callbacks.csv.filename={tmp_path / 'e.csv'}"]
    settings = to_settings(compose(["callbacks=early_stopping", *target]))
    built = parts.build_callbacks(settings.callbacks, settings.optimizer.schedule)
    assert [type(callback).__name__ for callback in built] == ["EarlyStopping", "CSVLogger"]
    assert built[1].filename == str(tmp_path / "e.csv") and built[0].monitor == "val_accuracy"


@pytest.mark.unit
def test_a_callback_monitoring_validation_without_validation_is_one_error():
    """Keras's EarlyStopping only warns, every epoch, about a metric that never comes, and never stops."""
    without = ["trainer.validate=false", "objective.metric=loss", "callbacks=early_stopping"]
    settings = to_settings(compose([*without, "callbacks.early_stopping.monitor=val_loss"]))
    with pytest.raises(
        ConfigError,
        match=r"^callbacks\.early_stopping\.monitor=val_loss: trainer\.validate=false leaves no validation metrics; "
        r"monitor loss or validate in fit$",
    ):
        parts.build_callbacks(settings.callbacks, settings.optimizer.schedule, validate=settings.trainer.validate)
    following = to_settings(compose(without))  # the monitor follows objective.metric
    assert parts.build_callbacks(following.callbacks, following.optimizer.schedule, validate=False)[0].monitor == "loss"


@pytest.mark.unit
def test_a_callback_target_that_is_no_callback_is_one_error():
    settings = to_settings(compose(["+callbacks.bad._target_=collections.OrderedDict"]))
    with pytest.raises(
        ConfigError, match=r"callbacks\.bad\._target_=collections\.OrderedDict must be a Keras callback"
    ):
        parts.build_callbacks(settings.callbacks, settings.optimizer.schedule)


@pytest.mark.unit
def test_another_keras_optimizer_is_one_key_away():
    settings = to_settings(compose(["optimizer=adam", "optimizer._target_=keras.optimizers.Nadam"]))
    optimizer = build_optimizer(settings.optimizer._target_, 0.01, settings.optimizer.keras_options())
    assert isinstance(optimizer, keras.optimizers.Nadam)
    assert "lr" not in settings.optimizer.keras_options() and "schedule" not in settings.optimizer.keras_options()


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, kind, replicas",
    [
        (["strategy=single"], "_DefaultDistributionStrategy", 1),
        (["strategy=single", "strategy.device=/cpu:0"], "OneDeviceStrategy", 1),
        (["strategy=mirrored", "strategy.cpu_devices=2"], "MirroredStrategy", 2),
    ],
)
def test_each_strategy_option_builds_its_strategy(overrides, kind, replicas):
    strategy = build_strategy(to_settings(compose(overrides)).strategy)
    assert type(strategy).__name__ == kind and strategy.num_replicas_in_sync == replicas


@pytest.mark.unit
def test_the_chosen_trackers_are_built_and_connected(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = to_settings(compose(["logger=[tensorboard,mlflow]", f"logger.tracking_uri={uri}"]))
    trackers, others = parts.build_trackers(settings.logger, tmp_path / "run" / "tensorboard")
    assert [type(tracker) for tracker in trackers] == [MLflowTracker] and trackers[0].client is not None
    assert [type(other) for other in others] == [TensorBoard] and isinstance(others[0], keras.callbacks.TensorBoard)
    assert others[0].log_dir == str(tmp_path / "run" / "tensorboard")
    assert parts.build_trackers(to_settings(compose(["logger=csv"])).logger, tmp_path) == ([], [])


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, schema",
    [
        ([], "BinaryFiles VGG19Config AdamConfig SingleStrategyConfig"),
        (["dataset=cats_dogs", "model=vgg19_imagenet", "optimizer=sgd", "strategy=mirrored"], None),
    ],
)
def test_the_sections_are_typed_by_their_options_schema(overrides, schema):
    settings = to_settings(compose(overrides))
    kinds = " ".join(
        type(part).__name__ for part in (settings.dataset, settings.model, settings.optimizer, settings.strategy)
    )
    assert kinds == (schema or "TFRecordFiles VGG19ImageNetConfig SGDConfig MirroredStrategyConfig")


@pytest.mark.unit
def test_a_key_of_another_optimizer_is_refused_when_composed():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as raised:  # Adam has no momentum: it used to be ignored
        compose(["optimizer=adam", "optimizer.momentum=0.5"])
    assert "momentum" in str(raised.value.__cause__)


@pytest.mark.integration
def test_the_steps_of_train_can_each_run_alone(cifar_dir, tmp_path):
    """plan_run decides the data, steps, rate and phases; build_run_model the model and what its checkpoints say."""
    from trainer.tasks import train
    from trainer.tasks.runtime import setup_strategy

    settings = to_settings(compose(cifar_overrides(cifar_dir), tmp_path / "run"))
    plan = train.plan_run(settings, setup_strategy(settings))
    assert (plan.steps_per_epoch, plan.lr, plan.chief, plan.metric) == (2, 0.001, True, "val_accuracy")
    assert [(phase.start, phase.end) for phase in plan.phases] == [(0, 1)]
    assert plan.data.normalization == "standardize" and plan.data.augment.flip and plan.data.input_shape == (28, 28, 3)
    models, info = train.build_run_model(settings, plan)
    random = [layer.name for layer in models.training.layers if layer.name.startswith("random_")]
    assert random == ["random_flip", "random_brightness", "random_contrast"]
    assert not any(layer.name in random for layer in models.inference.layers)
    assert (
        models.inference.input.dtype == "uint8"
        and info.class_names[0] == "airplane"
        and (info.resize_to, info.image_size) == (32, 28)
    )
    assert not (tmp_path / "run").exists(), "planning and building write nothing"
