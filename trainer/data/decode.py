"""The one decode: encoded image bytes to uint8 RGB pixels of one square size, in the TensorFlow graph.

    python run.py dataset=folder dataset.data_dir=photos/                 # training and evaluation
    python run.py mode=predict checkpoint=RUN predict.input=photos/       # prediction on files and records
    python -m trainer.convert photos/ records/                            # the converter
    # and the exported model's `serve_bytes` signature

Every path that turns file bytes into pixels calls `decode_image`, so one photo gives the
same pixels in training, prediction, serving and conversion (no train/serve skew):

- JPEG: libjpeg's accurate integer DCT, Pillow's too (TensorFlow's default fast DCT differs
  by up to 4 levels), at the largest reduced DCT scale (1/2, 1/4, 1/8) that leaves the
  image at least the target size, and the EXIF orientation applied (the graph reads tag
  0x0112 of the APP1 segment). CMYK and grayscale become RGB.
- PNG (16-bit scaled to 8), GIF (its first frame), BMP and WebP; transparency is
  flattened onto white.
- The resize mode (`RESIZE_MODES`): squash to a square, centre-crop to one, or pad to one
  (centred on black); then the one resize of every path (`trainer.data.preprocess.to_model_size`):
  area averaging where the image shrinks, bilinear where it grows, rounded.

`DECODE` names these choices; a model's `vggtrain.json` and the converter's manifest record it,
and the readers check it. The functions are pure and run alike eagerly and inside `tf.data`.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from trainer.data.headers import exif_orientation, exif_orientations, gif_first_frame, image_format, image_size
from trainer.data.preprocess import to_model_size
from trainer.errors import DataError

RESIZE_MODES = ("resize", "crop", "pad")  # squash to a square | centre crop to a square | pad to a square
MAX_PIXELS = 89_478_485  # Pillow's decompression-bomb limit: a larger image is refused before it is decoded
DECODE = "vggtrain-decode-2: jpeg INTEGER_ACCURATE, reduced DCT scale, EXIF orientation, first frame, alpha on white, area down, bilinear up"  # noqa: E501


def check_decode(recorded: str | None, source: str) -> None:
    """Refuses pixels decoded another way than this version decodes: a model or a converted folder whose
    record names another decode. None or "" (saved before the decode was recorded) passes.

    Raises:
        DataError: `recorded` names another decode; the message names `source`.
    """
    if recorded and recorded != DECODE:
        raise DataError(
            f"{source}: its images were decoded as '{recorded}', and this version decodes as '{DECODE}'; "
            f"train (or convert) again with this version, so that training, prediction and serving decode alike"
        )


def _flip(image: tf.Tensor, axis: int) -> tf.Tensor:
    """`image` mirrored along `axis`, by a gather: `tf.reverse`'s negative strides make Grappler's remapper
    print an error line for every graph that holds one."""
    return tf.gather(image, tf.range(tf.shape(image)[axis] - 1, -1, -1), axis=axis)


def apply_orientation(image: tf.Tensor, orientation: tf.Tensor) -> tf.Tensor:
    """Turns an [h, w, c] image upright, as Pillow's `ImageOps.exif_transpose` does for orientations 1 to 8."""
    transpose = lambda x: tf.transpose(x, [1, 0, 2])  # noqa: E731
    branches = [
        lambda: image,  # 1: upright
        lambda: _flip(image, 1),  # 2: mirrored left-right
        lambda: _flip(_flip(image, 0), 1),  # 3: rotated 180
        lambda: _flip(image, 0),  # 4: mirrored top-bottom
        lambda: transpose(image),  # 5: transposed
        lambda: _flip(transpose(image), 1),  # 6: rotated 90 clockwise to stand upright
        lambda: _flip(_flip(transpose(image), 0), 1),  # 7: transversed
        lambda: _flip(transpose(image), 0),  # 8: rotated 90 counter-clockwise
    ]
    return tf.switch_case(orientation - 1, branches)


def _jpeg_scale(shape: tf.Tensor, size: int, mode: str) -> tf.Tensor:
    """The index into 1, 2, 4, 8 of the largest DCT scale-down that keeps the side the resize reads >= `size`."""
    side = tf.reduce_max(shape) if mode == "pad" else tf.reduce_min(shape)
    return tf.reduce_sum(tf.cast(side // tf.constant([2, 4, 8]) >= size, tf.int32))


def _decode_jpeg(data: tf.Tensor, orientation: tf.Tensor, size: int | None, mode: str) -> tf.Tensor:
    """RGB pixels of a JPEG, reduced in the DCT where `size` allows, turned upright by its EXIF `orientation`."""
    decode = lambda ratio: lambda: tf.io.decode_jpeg(data, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE")  # noqa: E731
    if size is None:
        image = decode(1)()
    else:
        scale = _jpeg_scale(tf.io.extract_jpeg_shape(data)[:2], size, mode)
        image = tf.switch_case(scale, [decode(1), decode(2), decode(4), decode(8)])
    return apply_orientation(image, orientation)


def _on_white(color: tf.Tensor, alpha: tf.Tensor) -> tf.Tensor:
    """Colour channels composited onto white by their alpha, in exact integer arithmetic (opaque pixels keep
    their values)."""
    values, alpha = tf.cast(color, tf.int32), tf.cast(alpha, tf.int32)
    return tf.cast((values * alpha + 255 * (255 - alpha) + 127) // 255, tf.uint8)


def _rgb(image: tf.Tensor) -> tf.Tensor:
    """uint8 [h, w, 1|2|3|4] (gray, gray+alpha, RGB, RGBA) as RGB, transparency flattened onto white; the
    arithmetic runs only for an image with an alpha channel."""
    gray = lambda values: tf.concat([values] * 3, -1)  # noqa: E731
    branches = [
        lambda: gray(image[..., :1]),
        lambda: gray(_on_white(image[..., :1], image[..., 1:2])),
        lambda: image[..., :3],
        lambda: _on_white(image[..., :3], image[..., 3:4]),
    ]
    return tf.switch_case(tf.shape(image)[-1] - 1, branches)


def _check_mode(mode: str) -> None:
    if mode not in RESIZE_MODES:
        raise ValueError(f"mode must be one of {RESIZE_MODES}. Received: mode={mode}")


def to_square(image: tf.Tensor, mode: str) -> tf.Tensor:
    """An [h, w, 3] image made square: `resize` leaves it (the resize squashes it), `crop` cuts the centre
    square, `pad` centres it on black."""
    _check_mode(mode)
    if mode == "resize":
        return image
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    if mode == "crop":
        side = tf.minimum(height, width)
        return tf.image.crop_to_bounding_box(image, (height - side) // 2, (width - side) // 2, side, side)
    side = tf.maximum(height, width)
    return tf.image.pad_to_bounding_box(image, (side - height) // 2, (side - width) // 2, side, side)


def _check_header(data, kind, max_pixels: int, name="") -> tf.Operation:
    """The checks of one image's header, before any pixel is decoded: a known format, at most `max_pixels`; a
    refusal's message starts with `name` (a string tensor such as `image_bytes[3]: `, or "")."""
    known = tf.debugging.Assert(kind >= 0, [tf.strings.join([name, NOT_AN_IMAGE])])
    with tf.control_dependencies([known]):
        shape = image_size(data, kind)
    return tf.debugging.Assert(~_too_large(shape, max_pixels), [tf.strings.join([name, _bomb(shape, max_pixels)])])


NOT_AN_IMAGE = "not a JPEG, PNG, GIF, BMP or WebP image"


def _too_large(shape: tf.Tensor, max_pixels: int) -> tf.Tensor:
    return tf.cast(shape[0], tf.int64) * tf.cast(shape[1], tf.int64) > max_pixels


def _bomb(shape: tf.Tensor, max_pixels: int) -> tf.Tensor:
    return tf.strings.format(
        "decompression bomb: an image of {} x {} pixels, over the limit of {}", (shape[1], shape[0], max_pixels)
    )


def _decode_one(data, kind, orientation, size: int | None, mode: str, max_pixels: int, name="") -> tf.Tensor:
    """One image of `kind` (`image_format`) and EXIF `orientation` to uint8 [h, w, 3] RGB at its own size; a
    refusal's message starts with `name` (a string tensor such as `image_bytes[3]: `, or "")."""
    with tf.control_dependencies([_check_header(data, kind, max_pixels, name)]):
        branches = [
            lambda: _decode_jpeg(data, orientation, size, mode),  # RGB: CMYK and gray converted by libjpeg
            lambda: _rgb(tf.io.decode_png(data, channels=0)),
            lambda: tf.io.decode_gif(gif_first_frame(data))[0],  # the first frame only, RGB
            lambda: _rgb(tf.io.decode_bmp(data, channels=0)),
            lambda: _rgb(tf.io.decode_webp(data, channels=0)[0]),  # frames first, as GIF
        ]
        rgb = tf.switch_case(tf.maximum(kind, 0), branches)
    return tf.ensure_shape(rgb, [None, None, 3])


def _to_size(image: tf.Tensor, size: int, mode: str) -> tf.Tensor:
    return tf.ensure_shape(to_model_size(to_square(image, mode)[tf.newaxis], size)[0], [size, size, 3])


@tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time
def decode_rgb(data: tf.Tensor, size: int | None = None, mode: str = "resize", max_pixels: int = MAX_PIXELS):
    """One encoded image to uint8 [h, w, 3] RGB at its own size (JPEG reduced in the DCT towards `size`).

    Raises (when run):
        InvalidArgumentError: not a JPEG, PNG, GIF, BMP or WebP image; larger than `max_pixels`; corrupt.
    """
    return _decode_one(data, image_format(data), exif_orientation(data), size, mode, max_pixels)


@tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time
def decode_images(
    data: tf.Tensor, size: int, mode: str = "resize", max_pixels: int = MAX_PIXELS, name: str | None = None
) -> tf.Tensor:
    """A batch of encoded images (string [n]) to uint8 [n, size, size, 3]: each decoded, made square by `mode`
    and resized. The headers of the whole batch are read at once; the images are decoded one by one.

    Args:
        data: The files' bytes: JPEG, PNG, GIF, BMP or WebP, whatever their names say.
        size: Side of the square output.
        mode: `resize`, `crop` or `pad` (`RESIZE_MODES`).
        max_pixels: A larger image is refused before it is decoded.
        name: Names each image in a refusal as `name[index]: ` (`image_bytes` in serving); None: unnamed.

    Raises (when run):
        InvalidArgumentError: an image is no JPEG, PNG, GIF, BMP or WebP image, larger than `max_pixels`, or
            corrupt.
    """
    _check_mode(mode)
    return _batch_decoder(size, mode, max_pixels, name)(data)


@functools.cache
def _batch_decoder(size: int, mode: str, max_pixels: int, name: str | None) -> tf.types.experimental.GenericFunction:
    """`decode_images` for one choice of its options, traced once per process: each pipeline that decodes (a
    data set has five or more) calls the same graph function instead of tracing the decoder again (1 s each)."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def decode(data: tf.Tensor) -> tf.Tensor:
        if name:
            return _decode_named(data, size, mode, max_pixels, name)
        return tf.map_fn(
            lambda item: _to_size(_decode_one(*item, size, mode, max_pixels), size, mode),
            (data, image_format(data), exif_orientations(data)),
            fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8),
        )

    return decode


_PARALLEL_DECODES = 10


def _reason(data: tf.Tensor, kind: tf.Tensor, max_pixels: int) -> tf.Tensor:
    """Why one image that did not decode gives no pixels, read again without raising: its header, then pixels."""
    read = tf.data.Dataset.from_tensors(data).map(lambda one: image_size(one, tf.maximum(kind, 0)))
    unreadable = tf.data.Dataset.from_tensors(tf.constant([-1, -1]))
    shape = read.ignore_errors().concatenate(unreadable).batch(2).get_single_element()[0]
    corrupt = tf.where(_too_large(shape, max_pixels), _bomb(shape, max_pixels), "corrupt or truncated image")
    header = tf.where(shape[0] < 0, "corrupt or truncated image: its header does not read", corrupt)
    return tf.where(kind < 0, NOT_AN_IMAGE, header)


def decode_checked(data: tf.Tensor, size: int, mode: str = "resize", max_pixels: int = MAX_PIXELS):
    """`decode_images` that never raises: (uint8 [n, size, size, 3], string [n] reasons), a refused image black
    with its reason, a decoded one with "". Our header checks could say why, but libjpeg's and libpng's own
    errors (`Invalid JPEG data, size 459` for a truncated file) cannot be caught in a graph: so the batch is
    decoded whole inside a one-element tf.data map that drops a failure (as fast as `decode_images`), and only a
    batch that failed is decoded again image by image (`_decode_one_by_one`) for each image's reason."""
    _check_mode(mode)
    return _checked_decoder(size, mode, max_pixels)(data)


@functools.cache
def _checked_decoder(size: int, mode: str, max_pixels: int) -> tf.types.experimental.GenericFunction:
    """`decode_checked` for one choice of its options, traced once per process (as `_batch_decoder`): its
    image-by-image fallback is a large graph, which every pipeline that decodes would otherwise trace again."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def decode(data: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        count = tf.shape(data)[0]
        whole = tf.data.Dataset.from_tensors(data).map(
            lambda batch: (_batch_decoder(size, mode, max_pixels, None)(batch), True)
        )
        failed = tf.data.Dataset.from_tensors((tf.zeros([0, size, size, 3], tf.uint8), False))
        images, decoded = whole.ignore_errors().concatenate(failed).take(1).get_single_element()
        return tf.cond(
            decoded,
            lambda: (tf.ensure_shape(images, [None, size, size, 3]), tf.fill([count], "")),
            lambda: _decode_one_by_one(data, size, mode, max_pixels),
        )

    return decode


def _decode_one_by_one(data: tf.Tensor, size: int, mode: str, max_pixels: int):
    """`decode_checked` image by image: each decoded by a tf.data map that drops the ones that fail, and each
    one missing read again for its reason."""
    count = tf.shape(data)[0]
    kinds = image_format(data)
    items = tf.data.Dataset.from_tensor_slices((tf.range(count), data, kinds, exif_orientations(data)))
    decoded = items.map(
        lambda index, *item: (index, _to_size(_decode_one(*item, size, mode, max_pixels), size, mode)),
        num_parallel_calls=_PARALLEL_DECODES,  # as many as map_fn's parallel iterations; not autotuned
        deterministic=True,
    ).ignore_errors()
    # One element past the images, so that an empty or wholly refused batch still makes one batch of them.
    past = tf.data.Dataset.from_tensors((count, tf.zeros([size, size, 3], tf.uint8)))
    indices, images = decoded.concatenate(past).batch(tf.cast(count, tf.int64) + 1).get_single_element()
    images = tf.scatter_nd(indices[:, tf.newaxis], images, [count + 1, size, size, 3])[:count]
    done = tf.scatter_nd(indices[:, tf.newaxis], tf.ones_like(indices), [count + 1])[:count] > 0
    reasons = tf.map_fn(
        lambda item: tf.cond(item[0], lambda: tf.constant(""), lambda: _reason(item[1], item[2], max_pixels)),
        (done, data, kinds),
        fn_output_signature=tf.string,
    )
    return tf.ensure_shape(images, [None, size, size, 3]), reasons


def _decode_named(data: tf.Tensor, size: int, mode: str, max_pixels: int, name: str) -> tf.Tensor:
    """`decode_images` of a batch whose every refusal names its image as `name[index]: ` (`decode_checked`)."""
    images, reasons = decode_checked(data, size, mode, max_pixels)
    bad = tf.where(reasons != "")[:, 0]
    first = tf.cast(tf.concat([bad, [0]], 0)[0], tf.int32)
    message = tf.strings.join([f"{name}[", tf.strings.as_string(first), "]: ", tf.concat([reasons, [""]], 0)[first]])
    with tf.control_dependencies([tf.debugging.Assert(tf.size(bad) == 0, [message])]):
        return tf.identity(images)


@tf.autograph.experimental.do_not_convert  # plain TF ops: autograph's conversion only costs tracing time
def decode_image(data: tf.Tensor, size: int, mode: str = "resize", max_pixels: int = MAX_PIXELS) -> tf.Tensor:
    """One encoded image (a scalar string) to uint8 [size, size, 3], as `decode_images` decodes each of a batch."""
    return _image_decoder(size, mode, max_pixels)(data)


@functools.cache
def _image_decoder(size: int, mode: str, max_pixels: int) -> tf.types.experimental.GenericFunction:
    """`decode_image` for one choice of its options, traced once per process (as `_batch_decoder`)."""

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
    def decode(data: tf.Tensor) -> tf.Tensor:
        return _to_size(decode_rgb(data, size, mode, max_pixels), size, mode)

    return decode
