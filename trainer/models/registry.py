"""Builds any model a config names by `_target_`: the built-in VGG19 builders and your own, one code path.

    python run.py model=custom model._target_=my_package.models.build model.units=64

A builder is any importable function that returns an uncompiled `keras.Model`
taking float images of `input_shape` and returning `num_classes` softmax
probabilities. It is called through `hydra.utils.instantiate` with
`num_classes`, `input_shape` and every other key of the `model` group except
the ones in `RESERVED` (which describe the model to the trainer, not to the builder).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from trainer.errors import ConfigError, UserError

RESERVED = ("_target_", "name", "preprocessing")  # read by the trainer, never passed to the builder


def builder_options(model: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a `model` section that go to its builder."""
    return {key: value for key, value in model.items() if key not in RESERVED}


def _first_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__


def build_model(model: Mapping[str, Any], num_classes: int, input_shape: tuple[int, int, int]) -> keras.Model:
    """Calls `model["_target_"]` with `num_classes`, `input_shape` and the section's other keys.

    Args:
        model: The `model` config section as a plain mapping (`_target_`, `name`, builder keys).
        num_classes: Units of the classifier.
        input_shape: (height, width, channels) of the float images the network takes.

    Returns:
        The uncompiled network.

    Raises:
        ConfigError: the target cannot be imported or called with these keys, fails, or returns
            something other than a `keras.Model` with `num_classes` outputs.
    """
    target = model.get("_target_")
    if not target or not isinstance(target, str):
        raise ConfigError(f"model._target_ must name a builder function, e.g. my_package.build; got {target!r}")
    options = builder_options(model)
    try:
        network = instantiate(
            {"_target_": target, **options}, num_classes=num_classes, input_shape=tuple(input_shape), _convert_="all"
        )
    except InstantiationException as error:  # cannot import the target, bad keys, or the builder raised
        if isinstance(error.__cause__, UserError):  # the builder's own clear error (e.g. a missing weights file)
            raise error.__cause__ from None
        raise ConfigError(f"model._target_={target} (keys {sorted(options)}): {_first_line(error)}") from error
    if not isinstance(network, keras.Model):
        raise ConfigError(f"model._target_={target} must return a keras.Model; got {type(network).__name__}")
    outputs = network.outputs[0].shape[-1] if network.outputs else None
    if outputs != num_classes:
        raise ConfigError(
            f"model._target_={target} returned a model with {outputs} outputs; the dataset has {num_classes} classes"
        )
    return network
