"""Starting a network from another model's weights, layer by layer: what `model.init_from=RUN` does.

    python run.py dataset=folder dataset.data_dir=photos/ model.init_from=outputs/2026-12-01/10-00-00

Layers are matched by name (VGG19's `block1_conv1` ... `predictions`), and each must hold
weights of the same shapes. The head (the layer that gives the probabilities) can be left
as built, for data of other classes.
"""

from __future__ import annotations

import keras

from trainer.models.preprocessing import inner_layers


class NetworkMismatch(ValueError):
    """The source's layers are not the target's: the message says the first difference."""


def _weighted(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """{name: layer} of the layers of `model` (nested models opened) that hold weights of their own."""
    return {layer.name: layer for layer in inner_layers(model) if layer.weights and not isinstance(layer, keras.Model)}


def head_name(model: keras.Model) -> str:
    """The last layer with weights of `model`: the one whose units are the classes."""
    return list(_weighted(model))[-1]


def copy_weights(source: keras.Model, target: keras.Model, new_head: bool = False) -> int:
    """Sets every weighted layer of `target` to the weights of the same-named layer of `source`; with
    `new_head`, the head (`head_name`) keeps the weights it was built with. Returns the layers copied.

    Raises:
        NetworkMismatch: a layer is in one model only, or holds weights of other shapes.
    """
    theirs, ours = _weighted(source), _weighted(target)
    skip = {head_name(source), head_name(target)} if new_head else set()
    missing = [name for name in ours if name not in theirs and name not in skip]
    extra = [name for name in theirs if name not in ours and name not in skip]
    if missing or extra:
        where = f"layer {missing[0]} is not in it" if missing else f"its layer {extra[0]} is not in this run's"
        raise NetworkMismatch(where)
    pairs = [(theirs[name], layer) for name, layer in ours.items() if name not in skip]
    for their, our in pairs:  # every shape first: nothing is half copied
        if len(our.weights) != len(their.weights):
            names = [[weight.name for weight in layer.weights] for layer in (their, our)]
            raise NetworkMismatch(f"layer {our.name} holds {names[0]} there and {names[1]} here")
        for mine, other in zip(our.weights, their.weights, strict=True):
            if tuple(mine.shape) != tuple(other.shape):
                raise NetworkMismatch(
                    f"layer {our.name}'s {mine.name} is {tuple(other.shape)} there and {tuple(mine.shape)} here"
                )
    for their, our in pairs:
        our.set_weights(their.get_weights())
    return len(pairs)
