"""Where the model looked: Grad-CAM heat maps of a batch, from a 4-D layer of the network inside the
inference model, in one batched `tf.GradientTape` pass (Selvaraju et al., 2017).

    python run.py mode=evaluate checkpoint=RUN                            # the last convolution block's
    python run.py mode=evaluate checkpoint=RUN evaluate.cam_layer=block4_conv4_relu

The class score is the logit: the input of the last `Dense` layer's softmax, worked out from its kernel
(the softmax's own gradient vanishes on confident predictions), else the log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from trainer.errors import ConfigError

KEY = "evaluate.cam_layer"
POOLING = (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D)


def _networks(model: keras.Model) -> list[keras.Model]:
    """`model` and each model nested in it, outermost first."""
    found = [model]
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += _networks(layer)
    return found


def _four_d(network: keras.Model) -> list[keras.layers.Layer]:
    return [
        layer
        for layer in network.layers
        if not isinstance(layer, keras.layers.InputLayer) and len(getattr(layer, "output", None).shape or ()) == 4
    ]


def _owner(model: keras.Model, name: str | None) -> tuple[keras.Model, keras.layers.Layer] | None:
    """The (network, layer) Grad-CAM reads: the layer named `name`, or by default the last 4-D layer that is
    not a pooling of the innermost network that has one (the last convolution block's output).

    Raises:
        ConfigError: `name` is no layer of the model, or its output is not 4-D.
    """
    networks = _networks(model)
    if name is None:
        for network in reversed(networks):
            candidates = [layer for layer in _four_d(network) if not isinstance(layer, POOLING)]
            if candidates:
                return network, candidates[-1]
        return None
    four_d = [layer.name for network in networks for layer in _four_d(network)]
    for network in networks:
        if name in [layer.name for layer in network.layers]:
            layer = network.get_layer(name)
            if layer.name not in four_d:
                raise ConfigError(
                    f"{KEY}: {name!r} has a {len(layer.output.shape)}-D output; Grad-CAM needs a 4-D (batch, "
                    f"height, width, channels) layer, e.g. {four_d[-1] if four_d else 'none in this model'}"
                )
            return network, layer
    raise ConfigError(f"{KEY}: no layer {name!r} in the model; its 4-D layers: {', '.join(four_d[-8:]) or 'none'}")


def _score_source(network: keras.Model) -> tuple[keras.KerasTensor, keras.layers.Layer | None]:
    """(tensor, dense): the last Dense layer's input and the layer, when it ends in a softmax; else the output."""
    last = network.layers[-1]
    if isinstance(last, keras.layers.Dense) and last.activation is keras.activations.softmax:
        return last.input, last
    if isinstance(last, keras.layers.Activation) and last.activation is keras.activations.softmax:
        return last.input, None  # its input is the logit
    return network.output, None


@dataclass(eq=False)
class GradCam:
    """Builds once, then maps uint8 images and classes to [0, 1] heat maps of the images' size."""

    model: keras.Model  # images -> (features, logits or probabilities)
    dense: keras.layers.Layer | None
    logits: bool
    layer: str

    @classmethod
    def build(cls, model: keras.Model, name: str | None) -> GradCam | None:
        """The Grad-CAM of `model` at layer `name` (default: the last convolution block's output); None when
        the model has no 4-D layer.

        Raises:
            ConfigError: `name` names no 4-D layer of the model.
        """
        found = _owner(model, name)
        if found is None:
            return None
        network, layer = found
        source, dense = _score_source(network)
        inner = keras.Model(network.inputs, [layer.output, source], name=f"{network.name}_cam")
        if network is model:
            return cls(inner, dense, source is not network.output, layer.name)
        x = inputs = keras.Input(shape=model.input_shape[1:], dtype=model.inputs[0].dtype)
        for step in model.layers:  # the inference model's chain: to_float, normalization, the network
            if isinstance(step, keras.layers.InputLayer):
                continue
            if step is network or (isinstance(step, keras.Model) and network in _networks(step)):
                if step is not network:
                    raise ConfigError(f"{KEY}: {layer.name!r} is nested more than one model deep")
                outputs = inner(x)
                break
            x = step(x)
        return cls(keras.Model(inputs, outputs), dense, source is not network.output, layer.name)

    def __call__(self, images: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Heat maps [n, height, width] in [0, 1] of class `classes[i]` for image `i`. Eager: for the few
        images of a report, tracing the gradient graph would cost more than running it."""
        maps = self._maps(tf.convert_to_tensor(images), tf.convert_to_tensor(classes, tf.int32)).numpy()
        peak = maps.reshape(len(maps), -1).max(axis=1)
        return maps / np.where(peak > 0, peak, 1.0)[:, None, None]

    def _maps(self, images: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            features, source = self.model(images, training=False)
            tape.watch(features)
            source = tf.cast(source, tf.float32)
            if self.dense is not None:  # the logits of the final Dense layer, before its softmax
                source = tf.matmul(source, tf.cast(self.dense.kernel, tf.float32))
                source = source + tf.cast(self.dense.bias, tf.float32) if self.dense.use_bias else source
            scores = source if self.logits else tf.math.log(tf.maximum(source, 1e-12))
            score = tf.reduce_sum(tf.gather(scores, classes, axis=1, batch_dims=1))
        gradients = tf.cast(tape.gradient(score, features), tf.float32)
        weights = tf.reduce_mean(gradients, axis=[1, 2], keepdims=True)  # one weight per channel and image
        maps = tf.nn.relu(tf.reduce_sum(weights * tf.cast(features, tf.float32), axis=-1))
        return tf.image.resize(maps[..., None], tf.shape(images)[1:3], method="bilinear")[..., 0]


def overlay(image: np.ndarray, heat: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The uint8 image with the heat map (jet colours) blended over it."""
    from matplotlib import colormaps

    colours = colormaps["jet"](heat)[..., :3] * 255.0
    return np.clip((1 - alpha) * image.astype(np.float32) + alpha * colours, 0, 255).astype(np.uint8)
