"""Every default lives once (YAML or typed schema, not both); choices are enums checked at compose time;
`python run.py --help` offers no internal schema as a choice."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from conftest import CONF, compose, run_cli
from trainer import config

pytestmark = pytest.mark.unit


def _defaults(schema: type) -> dict:
    """A dataclass's defaults, nested dataclasses as dicts (fields without a default left out)."""
    values = {}
    for item in dataclasses.fields(schema):
        if item.default is not dataclasses.MISSING and item.default != "???":
            values[item.name] = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
            values[item.name] = _defaults(type(value)) if dataclasses.is_dataclass(value) else value
    return values


def _repeated(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    found = []
    for key, value in values.items():
        if key == "defaults" or key not in defaults:
            continue
        if isinstance(defaults[key], dict) and isinstance(value, dict):
            found += _repeated(value, defaults[key], f"{prefix}{key}.")
        elif value == defaults[key]:
            found.append(f"{prefix}{key}={value!r}")
    return found


def _schema_of(path) -> type | None:
    for entry in OmegaConf.to_container(OmegaConf.load(path)).get("defaults", []):
        if isinstance(entry, str) and entry.startswith(f"/{config.SCHEMA_GROUP}/"):
            group, name = entry.split("@")[0].split("/")[-2:]
            return config.SCHEMAS.get(group, {}).get(name)
    return None


OPTION_FILES = sorted(path for path in CONF.glob("*/*.yaml") if _schema_of(path) is not None)


@pytest.mark.parametrize("path", OPTION_FILES, ids=[f"{path.parent.name}/{path.name}" for path in OPTION_FILES])
def test_an_option_file_sets_only_what_differs_from_its_schema(path):
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert _repeated(values, _defaults(_schema_of(path))) == []


def test_config_yaml_repeats_no_schema_default():
    values = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    assert _repeated(values, _defaults(config.Config)) == []


def test_the_schemas_are_found_and_every_group_file_is_typed():
    assert {path.parent.name for path in OPTION_FILES} == {"dataset", "model", "optimizer", "strategy"}
    untyped = sorted(path.name for path in CONF.glob("*/*.yaml") if _schema_of(path) is None)
    grouped = {
        path.name for group in ("dataset", "model", "optimizer", "strategy") for path in CONF.glob(f"{group}/*.yaml")
    }
    assert [name for name in untyped if name in grouped] == []  # model=custom too: its open schema


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.precision=float64", "trainer.precision"),
        ("dataset.augment.crop=diagonal", "dataset.augment.crop"),
        ("dataset.val_source=elsewhere", "dataset.val_source"),
        ("optimizer.schedule.name=linear", "optimizer.schedule.name"),
        ("objective.mode=up", "objective.mode"),
        ("evaluate.split=train", "evaluate.split"),
        ("inspect.split=all", "inspect.split"),
        ("logger.wandb_mode=cloud", "logger.wandb_mode"),
        ("mode=fly", "mode"),
    ],
)
def test_a_bad_choice_is_rejected_when_the_config_is_composed(override, key):
    with pytest.raises(ConfigCompositionException) as raised:
        compose([override])
    cause = str(raised.value.__cause__)
    assert "expected one of" in cause and f"full_key: {key}" in cause


def test_a_choice_compares_and_prints_as_its_string():
    settings = config.to_settings(compose(["objective.mode=min", "callbacks=early_stopping"]))
    assert settings.objective.mode == "min" and f"{settings.objective.mode}" == "min"
    assert settings.callbacks.early_stopping.mode == "min"  # follows objective.mode


def test_help_offers_no_internal_schema_as_a_choice():
    result = run_cli(["--help"])
    assert result.returncode == 0, result.stderr
    groups = result.stdout.split("== Config ==")[0]
    assert "model: custom, vgg19, vgg19_imagenet" in groups
    assert "logger: csv, many, mlflow, tensorboard, wandb" in groups
    assert "schema" not in groups
