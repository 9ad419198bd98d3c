"""The project's decode for clients without TensorFlow: encoded image bytes to the uint8 pixels an exported
ONNX or LiteRT model takes, with Pillow and numpy only (this module imports nothing else).

    from trainer.serving.client_decode import read_image
    pixels = read_image(open("cat.jpg", "rb").read(), "serving/pets/serving_info.json")  # uint8 [1, size, size, 3]

It repeats `trainer.data.decode.decode_images` and the evaluation crop, as `serve_bytes` applies them: the
accurate JPEG DCT at the same reduced scale, the EXIF orientation, the first frame, transparency flattened
onto white, the model's resize mode, then area averaging down and antialiased bilinear up at the size
`serving_info.json` names. The pixels equal `serve_bytes`'s (the JPEG DCT, its scaling and the EXIF
orientation exactly) except where float rounding of the resize lands on the other side of .5, and for
16-bit gray PNGs (libpng's 16-to-8 scaling): at most `MAX_DIFFERENCE` level on a few pixels
(tests/test_serving.py measures it on EXIF-rotated, RGBA, CMYK, 16-bit, odd-size and large files).
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from PIL import Image, ImageOps

MAX_DIFFERENCE = 1  # levels (of 255), on any pixel, from serve_bytes's
RESIZE_MODES = ("resize", "crop", "pad")  # as trainer.data.decode.RESIZE_MODES


def read_info(serving_info: str | os.PathLike) -> dict:
    """The decode settings of an export: {"resize_to", "image_size", "resize_mode"} from its serving_info.json."""
    with open(serving_info, encoding="utf-8") as handle:
        info = json.load(handle)
    return {
        "resize_to": int(info["resize_to"]),
        "image_size": int(info["image_size"]),
        "resize_mode": info.get("resize_mode", "resize"),  # exports before it was recorded: the default
    }


def read_image(data: bytes, serving_info: str | os.PathLike | dict) -> np.ndarray:
    """One encoded JPEG, PNG, GIF, BMP or WebP file to the model's input: uint8 [1, image_size, image_size, 3].

    Args:
        data: The file's bytes.
        serving_info: The export's serving_info.json, or `read_info`'s dict.
    """
    info = serving_info if isinstance(serving_info, dict) else read_info(serving_info)
    pixels = decode(data, info["resize_to"], info["resize_mode"])
    return center_crop(pixels, info["image_size"])[np.newaxis]


def decode(data: bytes, size: int, mode: str = "resize") -> np.ndarray:
    """`trainer.data.decode.decode_image`: uint8 [size, size, 3]."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"mode must be one of {RESIZE_MODES}. Received: mode={mode}")
    return to_model_size(to_square(decode_rgb(data, size, mode), mode), size)


def decode_rgb(data: bytes, size: int | None = None, mode: str = "resize") -> np.ndarray:
    """uint8 [h, w, 3] at the file's own size (a JPEG reduced in the DCT towards `size`, as the project does)."""
    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG" and size is not None:
        width, height = image.size
        side = max(width, height) if mode == "pad" else min(width, height)
        ratio = max([1] + [ratio for ratio in (2, 4, 8) if side // ratio >= size])
        if ratio > 1:  # libjpeg's scaled IDCT, as tf.io.decode_jpeg(ratio=...)
            image.draft(None, (width // ratio, height // ratio))
    image.seek(0)  # an animation's first frame
    if image.mode.startswith("I;16") or image.mode == "I":  # 16-bit gray: rounded to 8 bits as libpng scales
        gray = np.rint(np.asarray(image).astype(np.float64) / 257).clip(0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=-1)
    if image.format == "JPEG":  # the graph reads the orientation of JPEGs only
        image = ImageOps.exif_transpose(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = np.asarray(image.convert("RGBA")).astype(np.int32)
        color, alpha = rgba[..., :3], rgba[..., 3:]
        return ((color * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)  # onto white, as the graph
    return np.asarray(image.convert("RGB"))


def to_square(image: np.ndarray, mode: str) -> np.ndarray:
    """`trainer.data.decode.to_square`: squash later (`resize`), cut the centre square, or centre on black."""
    height, width = image.shape[:2]
    if mode == "resize":
        return image
    if mode == "crop":
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        return image[top : top + side, left : left + side]
    side = max(height, width)
    square = np.zeros((side, side, 3), np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    square[top : top + height, left : left + width] = image
    return square


def to_model_size(image: np.ndarray, size: int) -> np.ndarray:
    """`trainer.data.preprocess.to_model_size`: area averaging where the image shrinks, antialiased bilinear
    where it grows (either side), rounded half to even; untouched at its size."""
    height, width = image.shape[:2]
    if height == size and width == size:
        return image
    weights = _area if height >= size and width >= size else _triangle
    rows, columns = weights(height, size), weights(width, size)
    tall = np.tensordot(rows, image.astype(np.float32), axes=(1, 0))  # [size, width, 3]: rows first
    resized = np.einsum("iwc,jw->ijc", tall, columns)
    return np.clip(np.round(resized), 0, 255).astype(np.uint8)


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """The evaluation crop (`trainer.data.preprocess.center_crop`)."""
    top, left = (image.shape[0] - size) // 2, (image.shape[1] - size) // 2
    return image[top : top + size, left : left + size]


def _area(source: int, target: int) -> np.ndarray:
    """[target, source] weights of tf.image.resize(method="area"): each output pixel the mean of the source
    pixels it covers, by the fraction it covers."""
    scale = source / target
    starts, ends = np.arange(target) * scale, (np.arange(target) + 1) * scale
    pixels = np.arange(source)
    overlap = np.minimum(ends[:, None], pixels[None] + 1) - np.maximum(starts[:, None], pixels[None])
    return (np.maximum(overlap, 0) / scale).astype(np.float32)


def _triangle(source: int, target: int) -> np.ndarray:
    """[target, source] weights of tf.image.resize(antialias=True) (bilinear): a triangle kernel at half-pixel
    centres, widened by the scale where this side shrinks, normalized per output pixel (TensorFlow's
    ScaleAndTranslate, in float32)."""
    inverse = np.float32(source / target)
    kernel_scale = max(inverse, np.float32(1))
    centres = (np.arange(target, dtype=np.float32) + np.float32(0.5)) * inverse
    positions = np.arange(source, dtype=np.float32)[None] + np.float32(0.5) - centres[:, None]
    weights = np.maximum(np.float32(0), np.float32(1) - np.abs(positions / kernel_scale)).astype(np.float32)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)
