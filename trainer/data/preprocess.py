"""The host's preprocessing of whole batches of uint8 images: resize, then crops, every random parameter per image.

The host's job ends at uint8 pixels of the model's input size: resize, then crops,
which cut windows out of the stored bytes (the host view of `dataset.augment`).
Flips, colour augmentation and normalization run inside the model, on the
accelerator (`trainer.models.preprocessing`), so the pipeline moves a quarter of the
bytes of float32 and the saved model owns its preprocessing.

These are pure functions of a batch and a seed, so they behave the same eagerly
and inside `tf.data.Dataset.map`. They work on a `[batch, height, width, channels]`
tensor at once, which is several times faster per core than mapping the same ops
over single images.

Randomness is stateless: one int64 seed per batch, split into one stream per
operation, so a seeded run replays exactly, whatever the parallelism.

    python run.py mode=inspect inspect.augmented=true   # what the host pipeline yields
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import tensorflow as tf

from trainer.data.augmentation import Augmentation, Crop

# One stateless stream per random operation, derived from the batch seed.
_CROP_Y, _CROP_X, _AREA, _RATIO = 0, 1, 3, 4


@dataclass(frozen=True)
class Preprocess:
    """How stored pixels become the model's uint8 inputs."""

    image_size: int  # resize stored images to this square size first
    augment: Augmentation = field(default_factory=Augmentation)  # only its host view (the crops) is read here

    @classmethod
    def for_evaluation(cls, resize_to: int, image_size: int) -> Preprocess:
        """The evaluation preprocessing of a model: resize to `resize_to`, centre-crop to `image_size`."""
        if resize_to == image_size:
            return cls(image_size)
        return cls(resize_to, Augmentation(crop=Crop.random, crop_size=image_size))

    @property
    def output_size(self) -> int:
        """Side of the square image the model sees."""
        return self.augment.output_size(self.image_size)


def to_uint8(images: tf.Tensor) -> tf.Tensor:
    """Float pixels on the 0..255 scale, rounded to the nearest uint8 (saturating)."""
    return tf.saturate_cast(tf.round(images), tf.uint8)


def to_model_size(images: tf.Tensor, size: int) -> tf.Tensor:
    """uint8 RGB images of `size` x `size`: the one resize of every path (`trainer.data.decode` too), area
    averaging where the images shrink (a box filter: antialiased, and several times cheaper than
    `antialias=True`), bilinear where they grow, rounded; untouched at their size."""
    pixels = lambda: tf.cast(images, tf.float32)  # noqa: E731
    area = lambda: to_uint8(tf.image.resize(pixels(), [size, size], method="area"))  # noqa: E731
    bilinear = lambda: to_uint8(tf.image.resize(pixels(), [size, size], antialias=True))  # noqa: E731
    height, width = images.shape[1], images.shape[2]
    if height is not None and width is not None:
        if height != size or width != size:
            images = area() if height >= size and width >= size else bilinear()
    else:  # sizes known only when it runs (serving's any-size input, a decoded file)
        shape = tf.shape(images)[1:3]
        resized = lambda: tf.cond(tf.reduce_all(shape >= size), area, bilinear)  # noqa: E731
        channels = images.shape[-1]
        images = tf.cond(tf.reduce_all(shape == size), lambda: tf.identity(images), resized)
        images = tf.ensure_shape(images, [None, size, size, channels])
    if images.shape[-1] == 1:
        images = tf.image.grayscale_to_rgb(images)
    return images


def stream_seed(seed: tf.Tensor, stream: int) -> tf.Tensor:
    """The stateless seed of random stream `stream` of a batch's `seed` (MixUp and CutMix use streams 10-18)."""
    return tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])


def uniform(batch: tf.Tensor, seed: tf.Tensor, stream: int, low: float = 0.0, high: float = 1.0) -> tf.Tensor:
    """One uniform draw in [low, high) per image, from stream `stream` of the batch's `seed`."""
    return tf.random.stateless_uniform([batch], stream_seed(seed, stream), low, high)


def _crop_window(images: tf.Tensor, augment: Augmentation) -> tuple[int, int]:
    """(padding, window side) of a random or padded crop; (0, 0) for none."""
    if augment.crop == "random" and augment.crop_size:
        return 0, augment.crop_size
    if augment.crop == "pad" and augment.padding:
        return augment.padding, images.shape[1]
    return 0, 0


def draw_parameters(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Every random parameter of the augmentation, one per image, from stateless streams of `seed`."""
    batch = tf.shape(images)[0]
    params = {}
    pad, size = _crop_window(images, augment)
    if size:
        for name, stream, extent in (("top", _CROP_Y, images.shape[1]), ("left", _CROP_X, images.shape[2])):
            high = extent + 2 * pad - size + 1
            params[name] = tf.random.stateless_uniform([batch], stream_seed(seed, stream), 0, high, dtype=tf.int32)
    return params


def _window(images, top, left, height: int, width: int):
    """Crops a window at per-image offsets: two gathers (rows, then columns), any dtype."""
    images = tf.gather(images, top[:, None] + tf.range(height), axis=1, batch_dims=1)
    return tf.gather(images, left[:, None] + tf.range(width), axis=2, batch_dims=1)


def random_resized_crop(images: tf.Tensor, min_area: float, seed: tf.Tensor) -> tf.Tensor:
    """Inception-style crop: a box of random area in [min_area, 1] and aspect ratio in [3/4, 4/3],
    at a random position, resized back to the input size (uint8); every parameter drawn per image."""
    batch = tf.shape(images)[0]
    area = uniform(batch, seed, _AREA, min_area, 1.0)
    ratio = tf.exp(uniform(batch, seed, _RATIO, math.log(3 / 4), math.log(4 / 3)))
    height = tf.minimum(tf.sqrt(area / ratio), 1.0)
    width = tf.minimum(tf.sqrt(area * ratio), 1.0)
    top = uniform(batch, seed, _CROP_Y, 0.0, 1.0) * (1.0 - height)
    left = uniform(batch, seed, _CROP_X, 0.0, 1.0) * (1.0 - width)
    boxes = tf.stack([top, left, top + height, left + width], axis=1)
    size = [images.shape[1], images.shape[2]]
    return to_uint8(tf.image.crop_and_resize(images, boxes, tf.range(batch), size))


def _resized_crop(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tuple[tf.Tensor, Augmentation]:
    """Applies a random_resized crop; returns the images and the augmentation left to do."""
    if augment.crop != "random_resized":
        return images, augment
    return random_resized_crop(images, augment.min_area, seed), replace(augment, crop=Crop.none)


def center_crop(images: tf.Tensor, size: int) -> tf.Tensor:
    """The evaluation counterpart of the random crop."""
    top = (images.shape[1] - size) // 2
    left = (images.shape[2] - size) // 2
    return images[:, top : top + size, left : left + size, :]


def augment_geometry(images: tf.Tensor, augment: Augmentation, params: dict[str, tf.Tensor]) -> tf.Tensor:
    """Crop with drawn parameters, on the input dtype (uint8 moves 4x fewer bytes than float32)."""
    pad, size = _crop_window(images, augment)
    if not size:
        return images
    images = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]]) if pad else images
    return _window(images, params["top"], params["left"], size, size)


def augment_batch(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tf.Tensor:
    """The host's training augmentation of uint8 images: a random-resized crop, or a random/padded crop."""
    images, augment = _resized_crop(images, augment, seed)
    return augment_geometry(images, augment, draw_parameters(images, augment, seed))


def prepare_images(images: tf.Tensor, preprocess: Preprocess, seed: tf.Tensor | None = None) -> tf.Tensor:
    """uint8 NHWC images (any size, 1 or 3 channels) to the model's uint8 inputs; augments when a seed is given.

    Evaluation resizes to `image_size` and centre-crops to the output size; training
    crops at random instead, every parameter drawn per image.
    """
    images = to_model_size(images, preprocess.image_size)
    if seed is None:
        if preprocess.output_size != preprocess.image_size:
            images = center_crop(images, preprocess.output_size)
        return images
    return augment_batch(images, preprocess.augment, seed)
