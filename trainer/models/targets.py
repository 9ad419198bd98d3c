"""Builds what a config names by `_target_`: any importable function or class, called with the section's keys.

One code path for every part of a run a config names this way: the model (`trainer.models.registry.build_model`),
the optimizer, the strategy, the callbacks, the trackers and the dataset's parts. It sits in `models`, the lowest
layer that calls it, so `training` and `tasks` import it from below.
"""

from __future__ import annotations

from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from trainer.distribute.failures import is_peer_failure
from trainer.errors import ConfigError, UserError


def _first_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__


def build_target(key: str, target: Any, options: dict[str, Any], **runtime: Any) -> Any:
    """Calls `target` (an importable name) with `options` and the `runtime` arguments, through Hydra's `instantiate`.

    Args:
        key: The config section, for the error message (`model`, `optimizer`, `callbacks.early_stopping`).
        target: The `_target_` string.
        options: Keyword arguments from the config section.
        **runtime: Keyword arguments only known when the run starts (num_classes, learning_rate, log_dir...).

    Raises:
        ConfigError: the target is not a name, cannot be imported or called with these keys, or fails; the
            target's own `UserError` (e.g. a missing weights file) passes through as it is.
    """
    if not target or not isinstance(target, str):
        raise ConfigError(
            f"{key}._target_ must name an importable function or class, e.g. my_package.build; got {target!r}"
        )
    nested = _nested_targets(options, key)
    if nested:
        raise ConfigError(
            f"{nested[0]}._target_: only {key}._target_ is called; a `_target_` nested in its keys is refused "
            f"(a config from someone else's run folder is code: read it before running it)"
        )
    try:  # _recursive_=False: nothing nested is ever called
        return instantiate({"_target_": target, **options}, **runtime, _convert_="all", _recursive_=False)
    except InstantiationException as error:  # cannot import the target, bad keys, or the target raised
        if isinstance(error.__cause__, UserError):
            raise error.__cause__ from None
        if is_peer_failure(error.__cause__):  # a worker lost while the model's variables were broadcast
            raise error.__cause__ from None
        raise ConfigError(f"{key}._target_={target} (keys {sorted(options)}): {_first_line(error)}") from error


def _nested_targets(value: Any, path: str) -> list[str]:
    """The dotted paths under `path` of every mapping in `value` that holds a `_target_`."""
    found = []
    if isinstance(value, dict):
        for name, item in value.items():
            if isinstance(item, dict) and "_target_" in item:
                found.append(f"{path}.{name}")
            found += _nested_targets(item, f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if isinstance(item, dict) and "_target_" in item:
                found.append(f"{path}[{index}]")
            found += _nested_targets(item, f"{path}[{index}]")
    return found
