"""Builds what a config names by `_target_`: the built-in VGG19 builders and your own model, one code path;
and the other parts of a run (optimizer, strategy, callbacks, trackers) the same way.

    python run.py model=custom model._target_=my_package.models.build model.units=64

A model builder is any importable function that returns an uncompiled `keras.Model`
taking float images of `input_shape` and returning `num_classes` softmax
probabilities. It is called through `hydra.utils.instantiate` with `num_classes`,
`input_shape` and every other key of the `model` group (the schema's
`builder_options`: all but `_target_`, `name` and `preprocessing`, which describe the
model to the trainer).
"""

from __future__ import annotations

from typing import Any

import keras
from hydra.errors import InstantiationException
from hydra.utils import instantiate

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


def build_model(
    target: str, options: dict[str, Any], num_classes: int, input_shape: tuple[int, int, int]
) -> keras.Model:
    """Calls the builder `target` with `num_classes`, `input_shape` and `options`.

    Args:
        target: `model._target_`.
        options: The builder's keys of the `model` section.
        num_classes: Units of the classifier.
        input_shape: (height, width, channels) of the float images the network takes.

    Returns:
        The uncompiled network.

    Raises:
        ConfigError: the target cannot be imported or called with these keys, fails, or returns
            something other than a `keras.Model` with `num_classes` outputs.
    """
    network = build_target("model", target, options, num_classes=num_classes, input_shape=tuple(input_shape))
    if not isinstance(network, keras.Model):
        raise ConfigError(f"model._target_={target} must return a keras.Model; got {type(network).__name__}")
    shapes = [tuple(output.shape) for output in network.outputs or []]
    if len(shapes) != 1 or len(shapes[0]) != 2:
        raise ConfigError(
            f"model._target_={target} returned a model with outputs of shape {', '.join(map(str, shapes)) or 'none'}; "
            f"expected one output of shape (batch, {num_classes}): the probabilities of the dataset's classes"
        )
    if shapes[0][-1] != num_classes:
        raise ConfigError(
            f"model._target_={target} returned a model with {shapes[0][-1]} outputs; the dataset has {num_classes} "
            f"classes"
        )
    return network
