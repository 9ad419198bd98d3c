"""Every config group composes into valid settings; bad keys, types and values fail at startup."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from conftest import CONF, compose
from trainer.config import BinaryDatasetConfig, to_settings
from trainer.errors import ConfigError

GROUP_OPTIONS = [
    (group, path.stem)
    for group in ("dataset", "model", "optimizer", "strategy", "experiment", "debug", "callbacks", "logger")
    for path in sorted((CONF / group).glob("*.yaml"))
]
REQUIRED = {"model=custom": ["model._target_=trainer.models.vgg19.build_vgg19"]}  # keys without a default


@pytest.mark.parametrize("group, option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_and_validates(group, option):
    settings = to_settings(compose([f"{group}={option}", *REQUIRED.get(f"{group}={option}", [])]))
    assert settings.mode == "train"


def test_default_is_digits_with_the_tuned_model():
    settings = to_settings(compose([]))
    assert isinstance(settings.dataset, BinaryDatasetConfig)
    assert settings.dataset.name == "digits"
    assert settings.model.width_multiplier == 0.25  # from conf/dataset_model/digits_vgg19.yaml
    assert settings.objective.metric == "val_accuracy"


def test_experiment_preset_switches_dataset_and_recipe():
    settings = to_settings(compose(["experiment=cifar_vgg19"]))
    assert settings.dataset.name == "cifar"
    assert settings.model.batch_norm and settings.model.width_multiplier == 1.0
    assert settings.optimizer.lr == 0.1 and settings.optimizer.schedule.name == "step"


def test_command_line_beats_the_preset():
    settings = to_settings(compose(["experiment=cifar_vgg19", "optimizer.lr=0.02"]))
    assert settings.optimizer.lr == 0.02


@pytest.mark.parametrize(
    "override, error, key",
    [
        ("model.dropuot=0.1", ConfigCompositionException, "dropuot"),
        ("trainer.epochs=many", ConfigCompositionException, "trainer.epochs"),
        ("model.dropout=1.0", ConfigError, "model.dropout"),
        ("optimizer.lr=-0.1", ConfigError, "optimizer.lr"),
        ("trainer.batch_size=0", ConfigError, "trainer.batch_size"),
        ("trainer.epochs=0", ConfigError, "trainer.epochs"),
        ("dataset.augment.crop=diagonal", ConfigCompositionException, "dataset.augment.crop"),
        ("optimizer.schedule.name=linear", ConfigCompositionException, "optimizer.schedule.name"),
        ("objective.mode=up", ConfigCompositionException, "objective.mode"),
        ("dataset.num_classes=3", ConfigError, "dataset.class_names"),
    ],
)
def test_bad_values_fail_naming_the_key(override, error, key):
    with pytest.raises((error, ConfigKeyError, ValidationError)) as raised:
        to_settings(compose([override]))
    message = str(raised.value) + str(raised.value.__cause__ or "")
    assert key in message
