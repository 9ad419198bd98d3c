"""The command composed once before Hydra runs it, so a value or an option Hydra refuses is one line.

    python run.py trainer.epochs=one      # error: trainer.epochs must be an integer; got 'one'
    python run.py optimizer=adamm         # error: optimizer must be one of adam, adamw, sgd; got 'adamm'
    python run.py dataset.imag_size=64    # the nearest key (trainer.cli.arguments.check_group_keys)

Hydra's own messages are six lines for the first (its merge error, OmegaConf's full_key and types)
and ten for the second, with the config search path and the options in the middle. A composition
error this module cannot word (or a command that adds a search path, which this compose would
not see) is left to Hydra.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from trainer.cli.arguments import GROUP_SECTIONS, check_group_keys
from trainer.cli.hydra_mode import UNKNOWN, Composed
from trainer.config import schema
from trainer.config.typos import unknown_key
from trainer.errors import ConfigError

# OmegaConf's first line for a value it cannot convert, and the type it wanted, as a user would say it
EXPECTED = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a text value"}
CONVERTED = re.compile(r"could not be converted to (\w+)")
ENUM_CHOICES = re.compile(r"expected one of \[(.*)\]")
# Flags and overrides that change where configs are found: this module's compose would not see them
SEARCH_PATH = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "hydra.searchpath")


def _key(argument: str) -> str:
    return argument.lstrip("+~").split("=", 1)[0]


def check_composes(arguments: list[str], config_dir: str, config_path: str | None = None) -> Any:
    """Composes the command's config as Hydra will (sweeps aside) and words its refusal: a value of the wrong
    type, an option its group lacks, a key its section lacks.

    Returns:
        The compose (`trainer.cli.hydra_mode.Composed`): its `hydra.mode` (None, RUN, MULTIRUN) for Hydra's
        `get_mode`, and where the command is a plain run, the config Hydra's run takes. `UNKNOWN` when this compose
        is not the one Hydra would make (a sweep over a group, a search path, a `hydra.mode` or `hydra/` override).

    Raises:
        ConfigError: one line naming the key, what it got, and the type or the choices it takes.

    `config_path` is Hydra's (`trainer.cli.main.config_location`): an installed wheel's `pkg://trainer.conf` is
    composed from the package, as Hydra's run does, so the config it takes names the same source.
    """
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, MissingConfigException

    if any(item.split("=", 1)[0].lstrip("+~") in SEARCH_PATH for item in arguments):
        return UNKNOWN
    overrides = [item for item in arguments if "=" in item and not item.startswith("-")]
    parser = OverridesParser.create()
    composed, mode_settings, swept = [], False, False
    for item in overrides:
        if _key(item).startswith(("hydra.", "hydra/")):
            mode_settings |= _key(item).startswith(("hydra.mode", "hydra/"))
            continue  # Hydra's own settings are not in the job's config: composed below for a plain run only
        if parser.parse_overrides([item])[0].is_sweep_override():
            if "." not in _key(item):
                return UNKNOWN  # a sweep over a config group: each job composes another section
            swept = True  # the sweep's jobs compose each value
            continue
        composed.append(item)
    # A plain run (overrides only: no flag, no sweep, no mode setting) composes every override, Hydra's own settings
    # too, as Hydra's run will
    plain = overrides == arguments and not (mode_settings or swept)
    GlobalHydra.instance().clear()
    cfg = None  # a refusal this module cannot word leaves it to Hydra
    try:
        if config_path and config_path.startswith("pkg://"):
            initialized = initialize_config_module(config_path.removeprefix("pkg://"), version_base="1.3")
        else:
            initialized = initialize_config_dir(config_dir=config_dir, version_base="1.3")
        with initialized:
            cfg = compose("config", overrides=overrides if plain else composed, return_hydra_config=True)
    except MissingConfigException as error:
        _raise_missing_option(error, composed)
    except ConfigCompositionException as error:
        _raise_merge_error(error, arguments, config_dir)
    finally:
        GlobalHydra.instance().clear()
    if any(item.startswith("+") and _key(item).split(".")[0] in GROUP_SECTIONS for item in composed):
        check_group_keys(arguments, config_dir)  # Hydra's `+` added the key, which no schema reads
    if mode_settings or swept or cfg is None:
        return UNKNOWN
    return Composed(cfg, tuple(overrides) if plain else None)


def _raise_missing_option(error: Exception, overrides: list[str]) -> None:
    """`optimizer=adamm`: the group, the option asked for, and the group's options."""
    missing = str(getattr(error, "missing_cfg_file", "") or "")
    options = getattr(error, "options", None)
    group, _, option = missing.rpartition("/")
    if not options or not group:
        return  # no such group, or the primary config: Hydra's message
    asked = next((item for item in overrides if _key(item) == group), f"{group}={option}")
    raise ConfigError(f"{_key(asked)} must be one of {', '.join(options)}; got {option!r}") from error


def _raise_merge_error(error: Exception, arguments: list[str], config_dir: str) -> None:
    """`trainer.epochs=one`: the key, the value, and the type it takes; `sed=3`: the nearest key."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = error.__cause__
    path = str(getattr(cause, "full_key", "") or "")
    if isinstance(cause, ValidationError) and path:
        reason = str(cause).splitlines()[0]
        value = str(getattr(cause, "value", ""))
        if value == "":
            value = next((item.split("=", 1)[1] for item in arguments if _key(item) == path), "")
        if match := CONVERTED.search(reason):
            expected = f"must be {EXPECTED.get(match.group(1), match.group(1).lower())}"
        elif "not a valid bool" in reason:
            expected = "must be true or false"
        elif match := ENUM_CHOICES.search(reason):
            expected = f"must be one of {match.group(1)}"
        else:
            expected = f"cannot take this value ({reason})"
        raise ConfigError(f"{path} {expected}; got {value!r}") from error
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and path:
        if "." not in path:
            raise unknown_key(path, [item.name for item in dataclasses.fields(schema.Config)]) from error
        if path.split(".")[0] in GROUP_SECTIONS:
            check_group_keys(arguments, config_dir)  # the nearest key of the section this command composes
