"""The schemas in Hydra's ConfigStore, and the composed config turned into checked dataclasses.

    python run.py --cfg job          # the composed config: the schemas' defaults, the YAML options, your overrides

Each option file of `conf/<group>/` pulls its schema in with
`- /hydra/schema/<group>/<name>@_here_`. Hydra's `--help` lists only groups outside
`hydra/`, so `dataset=binary_schema` is never offered as a choice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf

from trainer.config import groups, schema
from trainer.config.resolvers import register_resolvers
from trainer.config.typos import check_composed
from trainer.data import formats
from trainer.errors import ConfigError

SCHEMA_GROUP = "hydra/schema"
SCHEMAS: dict[str, dict[str, type]] = {
    "dataset": formats.schemas(),  # each file of trainer/data/formats/: <name>_schema
    "model": {
        "vgg19_schema": groups.VGG19Config,
        "vgg19_imagenet_schema": groups.VGG19ImageNetConfig,
        "custom_schema": groups.CustomModelConfig,
    },
    "optimizer": {"sgd_schema": groups.SGDConfig, "adam_schema": groups.AdamConfig, "adamw_schema": groups.AdamWConfig},
    "strategy": {
        "single_schema": groups.SingleStrategyConfig,
        "mirrored_schema": groups.MirroredStrategyConfig,
        "multi_worker_schema": groups.MultiWorkerStrategyConfig,
    },
}


def open_node(schema_class: type) -> DictConfig:
    """A schema that also takes keys it does not declare (`model=custom`'s builder keys, your own callbacks);
    `to_settings` collects them into the field the class names in `OPEN`."""
    node = OmegaConf.structured(schema_class)
    OmegaConf.set_struct(node, False)
    return node


def register() -> None:
    """Stores the schemas and registers the resolvers; safe to call twice."""
    store = ConfigStore.instance()
    root = OmegaConf.structured(schema.Config)
    root.callbacks = open_node(schema.CallbacksConfig)
    store.store(name="config_schema", node=root)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            stored = open_node(node) if getattr(node, "OPEN", None) else node
            store.store(group=f"{SCHEMA_GROUP}/{group}", name=name, node=stored)
    register_resolvers()


def _collect_open_keys(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} of the keys an open section holds beyond its schema's fields, resolved."""
    found = {}
    for section in ("model", "callbacks", "dataset"):
        node = cfg.get(section)
        kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if kind is None or not getattr(kind, "OPEN", None):
            continue
        declared = {item.name for item in dataclasses.fields(kind)}
        found[section] = {
            key: OmegaConf.to_container(node[key], resolve=True) if OmegaConf.is_config(node[key]) else node[key]
            for key in node
            if key not in declared
        }
    return found


def to_settings(cfg: DictConfig) -> schema.Config:
    """Resolves the composed config into dataclasses, running every range check.

    Raises:
        ConfigError: a value out of range, or a key without a value; one line naming the key.
    """
    try:
        check_composed(cfg)  # +trainer.epoch=2 would otherwise be dropped without a word
        extras = _collect_open_keys(cfg)
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
    for section, keys in extras.items():
        part = getattr(settings, section)
        getattr(part, part.OPEN).update(keys)
    return settings
