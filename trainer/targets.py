"""Builds what a config names by `_target_`: any importable function or class, called with the section's keys.

    python run.py model=custom model._target_=my_package.models.build model.units=64
    python run.py -m hparams_search=vgg19_optuna hydra.sweeper.pruner._target_=optuna.pruners.MedianPruner

One code path for every part of a run a config names this way: the model (`trainer.models.registry.build_model`),
the optimizer, the strategy, the callbacks, the trackers, the dataset's parts, and a search's sampler and pruner.
It sits beside `trainer.errors`, below every layer, and imports neither TensorFlow nor Keras, so the sweeper's
process (which never trains) builds through it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from trainer.errors import ConfigError, UserError, one_line


def build_target(
    key: str,
    target: Any,
    options: dict[str, Any],
    *,
    passes: Callable[[BaseException], bool] | None = None,
    **runtime: Any,
) -> Any:
    """Calls `target` (an importable name) with `options` and the `runtime` arguments, through Hydra's `instantiate`.

    Args:
        key: The config section, for the error message (`model`, `optimizer`, `callbacks.early_stopping`).
        target: The `_target_` string.
        options: Keyword arguments from the config section.
        passes: Says which errors are not the target's fault and pass through as they are, e.g. a lost peer's
            while a model's variables are broadcast (`trainer.distribute.failures.is_peer_failure`).
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
        if passes is not None and error.__cause__ is not None and passes(error.__cause__):
            raise error.__cause__ from None
        raise ConfigError(f"{key}._target_={target} (keys {sorted(options)}): {one_line(error)}") from error


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
