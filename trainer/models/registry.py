"""Builds the model a config names by `_target_`: the built-in VGG19 builders and your own model, one code path
(`trainer.targets.build_target`, which builds the other parts of a run the same way).

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

from trainer.distribute.failures import is_peer_failure
from trainer.errors import ConfigError
from trainer.targets import build_target


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
    network = build_target(  # a peer lost while the variables are broadcast is no fault of model._target_
        "model", target, options, passes=is_peer_failure, num_classes=num_classes, input_shape=tuple(input_shape)
    )

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
