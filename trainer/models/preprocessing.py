"""The model's own input layers: uint8 pixels in, the normalization it was trained with; for training, flips
and colour jitter.

    python run.py                              # the saved model takes uint8 [batch, 32, 32, 3]
    python run.py model=vgg19_imagenet         # ... with the caffe preprocessing of the ImageNet weights

`build_models(network, ...)` puts built-in Keras layers in front of any network,
so a saved `.keras` file carries its preprocessing into evaluation and serving
and loads in safe mode with none of this project's code. It builds two models
on the same layers: the inference model, which checkpoints hold, and the training
model, which adds the augmentation (Keras's random layers default to
`training=True`, and inside a saved model that default would reach batch norm
through a bare `model(x)` and make `model.export` trace a random graph):
- `to_float`: the cast (a `Rescaling` by 1, in float32 whatever the precision policy);
- `random_flip` (training only): a horizontal flip, drawn per image;
- `random_brightness`, `random_contrast` (training only): colour augmentation, one
  random factor per image (Keras draws a `[batch, 1, 1, 1]` factor);
- `rand_augment` or `aug_mix` (training only): Keras's `RandAugment` (2 random ops per
  image) or `AugMix`, at strength `dataset.augment.policy_magnitude`;
- `random_erasing` (training only): Keras's `RandomErasing`, a random rectangle of an image
  filled with noise, with probability `dataset.augment.random_erasing`;
- `standardize`: `LayerNormalization` over height, width and channels without centre or
  scale, i.e. `tf.image.per_image_standardization` (equal to within 3e-7); or
- `caffe`: what ImageNet VGG weights expect (`keras.applications.vgg19.preprocess_input`):
  a frozen 1x1 convolution that reverses RGB to BGR and subtracts the ImageNet means.

Crops stay on the host, where they cut windows out of the stored bytes and set the
input size (`trainer.data.preprocess`). The flip moved here: on the host, mirroring
uint8 batches was the slowest step of the raw TFRecord pipeline (`tf.reverse` on
3-byte pixels), while on an accelerator it costs nothing next to a VGG step.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import layers

from trainer.data.augmentation import Augmentation, Policy

NORMALIZATIONS = ("standardize", "caffe", "none")
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)  # keras.applications.vgg19.preprocess_input
PIXEL_RANGE = (0.0, 255.0)


def _caffe(name: str) -> layers.Conv2D:
    """RGB on 0..255 -> BGR minus the ImageNet means, as one frozen 1x1 convolution."""
    conv = layers.Conv2D(3, 1, name=name, trainable=False, dtype="float32")
    conv.build((None, None, None, 3))
    reverse = np.eye(3, dtype=np.float32)[::-1].reshape(1, 1, 3, 3)  # output channel c = input channel 2 - c
    conv.set_weights([reverse, -np.asarray(CAFFE_MEAN_BGR, np.float32)])
    return conv


def normalization_layer(normalization: str) -> layers.Layer | None:
    """The Keras layer for `normalization` (None for `none`)."""
    if normalization == "standardize":
        return layers.LayerNormalization(
            axis=[1, 2, 3], center=False, scale=False, epsilon=1e-12, dtype="float32", name="standardize"
        )
    if normalization == "caffe":
        return _caffe("caffe_preprocess")
    if normalization == "none":
        return None
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}. Received: normalization={normalization}")


def augmentation_layers(augment: Augmentation, seed: int) -> list[layers.Layer]:
    """Keras's random flip, brightness and contrast layers for the model view of `augment` (none when it
    changes nothing); its crops are the host's (`trainer.data.preprocess`)."""
    result = []
    if augment.flip:
        result.append(layers.RandomFlip("horizontal", seed=seed + 2, dtype="float32", name="random_flip"))
    if augment.brightness:
        result.append(
            layers.RandomBrightness(
                augment.brightness / PIXEL_RANGE[1],
                value_range=PIXEL_RANGE,
                seed=seed,
                dtype="float32",
                name="random_brightness",
            )
        )
    if (augment.contrast_lower, augment.contrast_upper) != (1.0, 1.0):
        result.append(
            layers.RandomContrast(
                (1.0 - augment.contrast_lower, augment.contrast_upper - 1.0),
                value_range=PIXEL_RANGE,
                seed=seed + 1,
                dtype="float32",
                name="random_contrast",
            )
        )
    return result + _policy_layers(augment, seed)


def _policy_layers(augment: Augmentation, seed: int) -> list[layers.Layer]:
    """Keras's RandAugment or AugMix, then RandomErasing, as `augment` asks."""
    result = []
    magnitude = {} if augment.policy_magnitude is None else {"factor": augment.policy_magnitude}
    if augment.policy == Policy.randaugment:
        result.append(layers.RandAugment(PIXEL_RANGE, seed=seed + 3, dtype="float32", name="rand_augment", **magnitude))
    elif augment.policy == Policy.augmix:
        result.append(layers.AugMix(PIXEL_RANGE, seed=seed + 3, dtype="float32", name="aug_mix", **magnitude))
    if augment.random_erasing:
        result.append(
            layers.RandomErasing(
                (augment.random_erasing, augment.random_erasing),  # (p, p): erase with probability p
                value_range=PIXEL_RANGE,
                seed=seed + 4,
                dtype="float32",
                name="random_erasing",
            )
        )
    return result


@dataclass(frozen=True)
class Models:
    """The two views of one set of layers. `inference` is what checkpoints hold and users deploy: uint8 in,
    cast, normalization, network, probabilities; nothing in it behaves differently in training. `training`
    shares every layer of it and adds the augmentation between the cast and the normalization; `fit`
    trains it and the backup saves it. Without augmentation the two are one model."""

    inference: keras.Model
    training: keras.Model


def _chain(inputs, layers_: list[layers.Layer | None]):
    x = inputs
    for layer in layers_:
        if layer is not None:
            x = layer(x)
    return x


def build_models(
    network: keras.Model,
    normalization: str = "standardize",
    augment: Augmentation | None = None,
    seed: int = 0,
    float_input: bool = False,
) -> Models:
    """`network` (float inputs of its own input shape) behind uint8 input and normalization; for training,
    also behind the augmentation.

    Args:
        network: A model whose input is float RGB of shape (height, width, 3).
        normalization: `standardize`, `caffe` or `none`.
        augment: Flip and colour augmentation, in the training model only.
        seed: Seeds the augmentation.
        float_input: The training model takes float32 pixels on the same 0..255 scale (MixUp and CutMix
            mix images on the host); the inference model always takes uint8.

    Returns:
        Both models, named like `network`, taking [batch, height, width, 3] pixels.
    """
    shape = tuple(network.input_shape[1:])
    if len(shape) != 3 or shape[-1] != 3:
        raise ValueError(f"network must take (height, width, 3) images. Received: input_shape={shape}")
    to_float = layers.Rescaling(1.0, dtype="float32", name="to_float")
    normalize = normalization_layer(normalization)
    image = keras.Input(shape=shape, dtype="uint8", name="image")
    inference = keras.Model(image, _chain(image, [to_float, normalize, network]), name=network.name)
    augmentation = augmentation_layers(augment or Augmentation(), seed)
    if not augmentation and not float_input:
        return Models(inference, inference)
    image = keras.Input(shape=shape, dtype="float32" if float_input else "uint8", name="image")
    training = keras.Model(image, _chain(image, [to_float, *augmentation, normalize, network]), name=network.name)
    return Models(inference, training)


def inner_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer of `model`, those of nested models included (depth first)."""
    result = []
    for layer in model.layers:
        result.append(layer)
        if isinstance(layer, keras.Model):
            result += inner_layers(layer)
    return result
