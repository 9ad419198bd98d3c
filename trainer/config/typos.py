"""A key that is no key of its section is one line naming the nearest key that is; the composed config's check.

    python run.py +trainer.epoch=2    # error: trainer.epoch is not a key of trainer; did you mean trainer.epochs?

`unknown_key` writes that line: `trainer.cli.arguments` checks the command line with it before
Hydra starts, and `check_composed` checks the config Hydra composed (`to_settings` calls it), where
a YAML file of conf/ or a run's saved config may carry a key no schema has. Sections whose schema
is open (`dataset=custom`, `model=custom`, `callbacks`) take any key.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.errors import ConfigError


def unknown_key(path: str, known: list[str]) -> ConfigError:
    """The one line for `path`, a key its section does not have, with the nearest of `known` where one is close."""
    section, _, key = path.rpartition(".")
    nearest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    where = f"a key of {section}" if section else "a top-level key"
    if nearest:
        hint = f"; did you mean {section + '.' if section else ''}{nearest[0]}?"
    else:
        hint = f"; its keys: {', '.join(sorted(known))}"
    return ConfigError(f"{path} is not {where}{hint}")


def check_composed(node: Any, path: str = "") -> None:
    """Every key of every typed section of the composed config is a field of its schema (open ones excepted).

    Raises:
        ConfigError: the first unknown key, naming the nearest known one.
    """
    if not isinstance(node, DictConfig):
        return
    kind = OmegaConf.get_type(node)
    declared = [item.name for item in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    open_schema = bool(getattr(kind, "OPEN", None))
    for key in node.keys():
        child = f"{path}.{key}" if path else str(key)
        if declared is not None and not open_schema and key not in declared:
            raise unknown_key(child, declared)
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        check_composed(node[key], child)
