"""Decode and augment whole batches of images, drawing every random parameter per image.

These are pure functions of a batch and a seed, so they behave the same
eagerly and inside `tf.data.Dataset.map`. They follow the classic TF CIFAR-10
recipe (random crop, flip, brightness, contrast, per-image standardization)
but work on a `[batch, height, width, channels]` tensor at once, which is
several times faster per core than mapping the same ops over single images.

Randomness is stateless: one int64 seed per batch, split into one stream per
operation, so a seeded run replays exactly, whatever the parallelism.

The training transform is XLA-compiled (`tf.function(jit_compile=True)` works
inside `tf.data` maps): XLA fuses the flip, the cast to float and the
standardization into a few loops over the batch, where TensorFlow's kernels
each stream the whole batch through memory. That made the 224x224 Cats-vs-Dogs
train pipeline 1.7x faster (2.1k to 3.6k images/s on 2 cores); 32x32 CIFAR
batches stay in cache, and there it makes no difference. The random parameters
are drawn outside the compiled function, by TensorFlow's kernels, so compiled
and uncompiled code give the same images for the same seed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

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


def _has_contrast(augment: Augmentation) -> bool:
    return (augment.contrast_lower, augment.contrast_upper) != (1.0, 1.0)


def _crop_window(images: tf.Tensor, augment: Augmentation) -> tuple[int, int]:
    """(padding, window side) of a random or padded crop; (0, 0) for none."""
    if augment.crop == "random" and augment.crop_size:
        return 0, augment.crop_size
    if augment.crop == "pad" and augment.padding:
        return augment.padding, images.shape[1]
    return 0, 0


def draw_parameters(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Every random parameter of the augmentation, one per image, from stateless streams of `seed`.

    They are drawn by TensorFlow's kernels, outside the compiled transform, so
    compiled and uncompiled code see the same numbers for the same seed.
    """
    batch = tf.shape(images)[0]
    params = {}
    pad, size = _crop_window(images, augment)
    if size:
        for name, stream, extent in (("top", _CROP_Y, images.shape[1]), ("left", _CROP_X, images.shape[2])):
            high = extent + 2 * pad - size + 1
            params[name] = tf.random.stateless_uniform([batch], _seed(seed, stream), 0, high, dtype=tf.int32)
    if augment.flip:
        params["flip"] = _uniform(batch, seed, _FLIP, 0.0, 1.0) < 0.5
    if augment.brightness:
        params["brightness"] = _uniform(batch, seed, _BRIGHTNESS, -augment.brightness, augment.brightness)
    if _has_contrast(augment):
        params["contrast"] = _uniform(batch, seed, _CONTRAST, augment.contrast_lower, augment.contrast_upper)
    return params


def _window(images, top, left, height: int, width: int, flip):
    """Crops a window at per-image offsets, mirrored where `flip`: two gathers (rows, then columns), any dtype."""
    rows = top[:, None] + tf.range(height)
    columns = tf.range(width)
    if flip is not None:
        columns = tf.where(flip[:, None], width - 1 - columns, columns)
    images = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(images, left[:, None] + columns, axis=2, batch_dims=1)


def flip(images: tf.Tensor, flips: tf.Tensor) -> tf.Tensor:
    """Mirrors left-right the images where `flips` is true (any dtype; XLA fuses it with what follows)."""
    return tf.where(flips[:, None, None, None], tf.reverse(images, [2]), images)


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


def _resized_crop(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tuple[tf.Tensor, Augmentation]:
    """Applies a random_resized crop (CropAndResize has no XLA kernel, so it runs before the compiled
    part); returns the images and the augmentation left to do."""
    if augment.crop != "random_resized":
        return images, augment
    return random_resized_crop(images, augment.min_area, seed), replace(augment, crop="none")


def center_crop(images: tf.Tensor, size: int) -> tf.Tensor:
    """The evaluation counterpart of the random crop."""
    top = (images.shape[1] - size) // 2
    left = (images.shape[2] - size) // 2
    return images[:, top : top + size, left : left + size, :]


def augment_geometry(images: tf.Tensor, augment: Augmentation, params: dict[str, tf.Tensor]) -> tf.Tensor:
    """Crop and flip with drawn parameters, on the input dtype (uint8 moves 4x fewer bytes than float32)."""
    pad, size = _crop_window(images, augment)
    if size:
        images = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]]) if pad else images
        return _window(images, params["top"], params["left"], size, size, params.get("flip"))
    return flip(images, params["flip"]) if "flip" in params else images


def adjust_color(images: tf.Tensor, params: dict[str, tf.Tensor]) -> tf.Tensor:
    """Brightness, then contrast, as `tf.image.random_brightness` and `tf.image.random_contrast` do;
    float32 on the 0..255 scale."""
    images = tf.cast(images, tf.float32)
    if "brightness" in params:
        images = images + params["brightness"][:, None, None, None]
    if "contrast" in params:
        factor = params["contrast"][:, None, None, None]
        mean = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
        images = (images - mean) * factor + mean
    return images


def augment_batch(images: tf.Tensor, augment: Augmentation, seed: tf.Tensor) -> tf.Tensor:
    """The whole training augmentation, one TensorFlow op after another, uncompiled; float32 on the 0..255 scale."""
    images, augment = _resized_crop(images, augment, seed)
    params = draw_parameters(images, augment, seed)
    return adjust_color(augment_geometry(images, augment, params), params)


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
    if seed is None:
        if preprocess.output_size != preprocess.image_size:
            images = center_crop(images, preprocess.output_size)
        return normalize(tf.cast(images, tf.float32), preprocess.normalization)
    images, augment = _resized_crop(images, preprocess.augment, seed)
    params = draw_parameters(images, augment, seed)
    return _compiled_transform(augment, preprocess.normalization)(images, params)


@functools.cache
def _compiled_transform(augment: Augmentation, normalization: str):
    """The XLA-compiled training transform (traced once per input shape and dtype)."""
    return tf.function(
        functools.partial(_train_transform, augment=augment, normalization=normalization), jit_compile=True
    )


def _train_transform(
    images: tf.Tensor, params: dict[str, tf.Tensor], augment: Augmentation, normalization: str
) -> tf.Tensor:
    images = augment_geometry(images, augment, params)
    if normalization == "standardize":  # brightness cancels, contrast fuses into the standardization
        return standardize(images, params.get("contrast"))
    return normalize(adjust_color(images, params), normalization)


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
