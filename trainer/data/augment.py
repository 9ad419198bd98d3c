"""Decode and augment whole batches of images, drawing every random parameter per image.

These are pure functions of a batch and a seed, so they behave the same
eagerly and inside `tf.data.Dataset.map`. They follow the classic TF CIFAR-10
recipe (random crop, flip, brightness, contrast, per-image standardization)
but work on a `[batch, height, width, channels]` tensor at once, which is
several times faster per core than mapping the same ops over single images.

Randomness is stateless: one int64 seed per batch, split into one stream per
operation, so a seeded run replays exactly, whatever the parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tensorflow as tf

from trainer.data.records import RecordFormat

# One stateless stream per random operation, derived from the batch seed.
_CROP_Y, _CROP_X, _FLIP, _BRIGHTNESS, _CONTRAST, _AREA, _RATIO = range(7)


@dataclass(frozen=True)
class Augmentation:
    """Training augmentation; see `conf/dataset/*.yaml` for each field."""

    crop: str = "none"  # random | pad | random_resized | none
    crop_size: int = 0
    padding: int = 4
    min_area: float = 0.25  # random_resized: smallest crop, as a fraction of the image area
    flip: bool = False
    brightness: float = 0.0
    contrast_lower: float = 1.0
    contrast_upper: float = 1.0


@dataclass(frozen=True)
class Preprocess:
    """How stored pixels become model inputs."""

    image_size: int  # resize stored images to this square size first
    augment: Augmentation = Augmentation()
    normalization: str = "standardize"  # standardize (per image) | caffe (ImageNet VGG: BGR, mean-subtracted) | none

    @property
    def output_size(self) -> int:
        """Side of the square image the model sees."""
        if self.augment.crop == "random" and self.augment.crop_size:
            return self.augment.crop_size
        return self.image_size


def decode_records(records: tf.Tensor, fmt: RecordFormat) -> tuple[tf.Tensor, tf.Tensor]:
    """Splits a batch of raw records into uint8 NHWC images and int32 labels.

    Image and label come from the same record, so they cannot drift apart.
    """
    raw = tf.io.decode_raw(records, tf.uint8)
    raw = tf.reshape(raw, [-1, fmt.record_bytes])
    labels = tf.cast(raw[:, fmt.label_index], tf.int32)
    # Pixels are stored channel-first: all of R, then G, then B.
    planes = tf.reshape(raw[:, fmt.label_bytes :], [-1, fmt.channels, fmt.height, fmt.width])
    return tf.transpose(planes, [0, 2, 3, 1]), labels


def to_model_size(images: tf.Tensor, size: int) -> tf.Tensor:
    """RGB images of `size` x `size` on the 0..255 scale: float32 if resized, else still the input dtype."""
    if images.shape[1] != size or images.shape[2] != size:
        images = tf.image.resize(tf.cast(images, tf.float32), [size, size], method="bilinear", antialias=True)
    if images.shape[-1] == 1:
        images = tf.image.grayscale_to_rgb(images)
    return images


def _seed(seed: tf.Tensor, stream: int) -> tf.Tensor:
    return tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])


def _uniform(batch: tf.Tensor, seed: tf.Tensor, stream: int, low: float, high: float) -> tf.Tensor:
    return tf.random.stateless_uniform([batch], _seed(seed, stream), low, high)


def _flips(batch: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    return _uniform(batch, seed, _FLIP, 0.0, 1.0) < 0.5


def random_crop(images: tf.Tensor, size: int, seed: tf.Tensor, flip: bool = False) -> tf.Tensor:
    """Crops a `size` x `size` window at an offset drawn for each image, mirrored for half of them if `flip`.

    Two gathers (rows, then columns) do the crop and the mirror at once, on any dtype.
    """
    batch, height, width = tf.shape(images)[0], tf.shape(images)[1], tf.shape(images)[2]
    top = tf.random.stateless_uniform([batch], _seed(seed, _CROP_Y), 0, height - size + 1, dtype=tf.int32)
    left = tf.random.stateless_uniform([batch], _seed(seed, _CROP_X), 0, width - size + 1, dtype=tf.int32)
    return _window(images, top, left, size, size, _flips(batch, seed) if flip else None)


def _window(images, top, left, height: int, width: int, flip):
    rows = top[:, None] + tf.range(height)
    columns = tf.range(width)
    if flip is not None:
        columns = tf.where(flip[:, None], width - 1 - columns, columns)
    images = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(images, left[:, None] + columns, axis=2, batch_dims=1)


def random_resized_crop(images: tf.Tensor, min_area: float, seed: tf.Tensor) -> tf.Tensor:
    """Inception-style crop: a box of random area in [min_area, 1] and aspect ratio in [3/4, 4/3],
    at a random position, resized back to the input size; every parameter drawn per image."""
    batch = tf.shape(images)[0]
    area = _uniform(batch, seed, _AREA, min_area, 1.0)
    ratio = tf.exp(_uniform(batch, seed, _RATIO, math.log(3 / 4), math.log(4 / 3)))
    height = tf.minimum(tf.sqrt(area / ratio), 1.0)
    width = tf.minimum(tf.sqrt(area * ratio), 1.0)
    top = _uniform(batch, seed, _CROP_Y, 0.0, 1.0) * (1.0 - height)
    left = _uniform(batch, seed, _CROP_X, 0.0, 1.0) * (1.0 - width)
    boxes = tf.stack([top, left, top + height, left + width], axis=1)
    size = [images.shape[1], images.shape[2]]
    return tf.image.crop_and_resize(images, boxes, tf.range(batch), size)


def center_crop(images: tf.Tensor, size: int) -> tf.Tensor:
    """The evaluation counterpart of `random_crop`."""
    top = (images.shape[1] - size) // 2
    left = (images.shape[2] - size) // 2
    return images[:, top : top + size, left : left + size, :]


def random_flip(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Mirrors each image left-right with probability 1/2 (one gather, any dtype)."""
    batch = tf.shape(images)[0]
    zeros = tf.zeros([batch], tf.int32)
    return _window(images, zeros, zeros, images.shape[1], images.shape[2], _flips(batch, seed))


def random_brightness(images: tf.Tensor, max_delta: float, seed: tf.Tensor) -> tf.Tensor:
    """Adds one delta in [-max_delta, max_delta) per image, as `tf.image.random_brightness`."""
    delta = _uniform(tf.shape(images)[0], seed, _BRIGHTNESS, -max_delta, max_delta)
    return images + delta[:, None, None, None]


def random_contrast(images: tf.Tensor, lower: float, upper: float, seed: tf.Tensor) -> tf.Tensor:
    """Scales each image's deviation from its per-channel mean, as `tf.image.random_contrast`."""
    factor = _uniform(tf.shape(images)[0], seed, _CONTRAST, lower, upper)[:, None, None, None]
    mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
    return (images - mean) * factor + mean


def augment_geometry(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tf.Tensor:
    """Crop and flip, per image, on the input dtype (uint8 moves 4x fewer bytes than float32)."""
    flip = augment.flip
    if augment.crop == "random" and augment.crop_size:
        images, flip = random_crop(images, augment.crop_size, seed, flip), False
    elif augment.crop == "pad" and augment.padding:
        size, pad = images.shape[1], augment.padding
        images = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        images, flip = random_crop(images, size, seed, flip), False
    elif augment.crop == "random_resized":
        images = random_resized_crop(images, augment.min_area, seed)
    return random_flip(images, seed) if flip else images


def _has_contrast(augment: Augmentation) -> bool:
    return (augment.contrast_lower, augment.contrast_upper) != (1.0, 1.0)


def augment_batch(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tf.Tensor:
    """Applies the whole training augmentation, one operation after another; float32 on the 0..255 scale."""
    images = tf.cast(augment_geometry(images, augment, seed), tf.float32)
    if augment.brightness:
        images = random_brightness(images, augment.brightness, seed)
    if _has_contrast(augment):
        images = random_contrast(images, augment.contrast_lower, augment.contrast_upper, seed)
    return images


def standardize(images: tf.Tensor, contrast: tf.Tensor | None = None) -> tf.Tensor:
    """`per_image_standardization(adjust_contrast(images, contrast))` in one pass of statistics and one
    multiply-add, instead of five passes over the pixels.

    With per-channel means m_c and variances v_c of an image, contrast c maps
    x -> c (x - m_c) + m_c, whose mean is m = mean_c(m_c) and variance
    mean_c(c^2 v_c + (m_c - m)^2); standardizing then gives x c/s + ((1 - c) m_c - m)/s
    with s = max(std, 1/sqrt(pixels)), exactly as TensorFlow's two ops do.
    A brightness shift before this changes nothing (no clipping happens), so it need not be applied.
    """
    images = tf.cast(images, tf.float32)
    min_std = 1.0 / math.sqrt(images.shape[1] * images.shape[2] * images.shape[3])
    if contrast is None:  # whole-image statistics: contiguous reductions, the fastest layout
        mean, variance = tf.nn.moments(images, axes=[1, 2, 3], keepdims=True)
        scale = 1.0 / tf.maximum(tf.sqrt(variance), min_std)
        return images * scale - mean * scale
    channel_mean, channel_var = tf.nn.moments(images, axes=[1, 2], keepdims=True)
    mean = tf.reduce_mean(channel_mean, axis=-1, keepdims=True)
    factor = tf.reshape(contrast, [-1, 1, 1, 1])
    variance = tf.reduce_mean(factor**2 * channel_var + (channel_mean - mean) ** 2, axis=-1, keepdims=True)
    scale = 1.0 / tf.maximum(tf.sqrt(variance), min_std)
    return images * (factor * scale) + ((1.0 - factor) * channel_mean - mean) * scale


def preprocess_batch(
    records: tf.Tensor,
    fmt: RecordFormat,
    preprocess: Preprocess,
    seed: tf.Tensor | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Raw records to (model-ready images, labels); augments when a seed is given, else evaluates."""
    images, labels = decode_records(records, fmt)
    return prepare_images(images, preprocess, seed), labels


def prepare_images(images: tf.Tensor, preprocess: Preprocess, seed: tf.Tensor | None = None) -> tf.Tensor:
    """uint8 NHWC images (any size, 1 or 3 channels) to model inputs; augments when a seed is given."""
    images = to_model_size(images, preprocess.image_size)
    augment = preprocess.augment
    if seed is None:
        if preprocess.output_size != preprocess.image_size:
            images = center_crop(images, preprocess.output_size)
        return normalize(tf.cast(images, tf.float32), preprocess.normalization)
    if preprocess.normalization == "standardize":  # the fast path: brightness cancels, contrast fuses
        images = augment_geometry(images, augment, seed)
        contrast = None
        if _has_contrast(augment):
            contrast = _uniform(tf.shape(images)[0], seed, _CONTRAST, augment.contrast_lower, augment.contrast_upper)
        return standardize(images, contrast)
    return normalize(augment_batch(images, augment, seed), preprocess.normalization)


NORMALIZATIONS = ("standardize", "caffe", "none")
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)  # keras.applications.vgg19.preprocess_input


def normalize(images: tf.Tensor, normalization: str) -> tf.Tensor:
    """float32 RGB images on the 0..255 scale to model inputs.

    `standardize`: per-image zero mean and unit variance. `caffe`: what ImageNet
    VGG weights expect (`keras.applications.vgg19.preprocess_input`): RGB to BGR,
    then the ImageNet channel means subtracted. `none`: unchanged.
    """
    if normalization == "standardize":
        return standardize(images)
    if normalization == "caffe":
        return images[..., ::-1] - tf.constant(CAFFE_MEAN_BGR, tf.float32)
    if normalization == "none":
        return images
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}. Received: normalization={normalization}")
