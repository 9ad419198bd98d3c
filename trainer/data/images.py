"""Read any image file Pillow understands as a square RGB uint8 array, or say why it cannot.

Handles what real photo folders contain (the PetImages set among them):
EXIF rotation, grayscale, palette, alpha, CMYK and 16-bit images, PNGs named
`.jpg`, and truncated, empty or non-image files, which raise `ImageError`
with the reason instead of stopping a whole job.

    python -m trainer.convert PetImages/ records/      # uses this for every file
"""

from __future__ import annotations

import errno
import io
import os
import stat
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

RESIZE_MODES = ("resize", "crop", "pad")  # plain resize | centre crop to square | pad to square


class ImageError(Exception):
    """A file that is not a usable image; the message is the reason."""


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16/32-bit grayscale: scale, do not clip
        values = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
        image = Image.fromarray(np.clip(values / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):  # flatten transparency onto white
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


def _square(image: Image.Image, mode: str) -> Image.Image:
    if mode == "crop":
        return ImageOps.fit(image, (min(image.size),) * 2, method=Image.Resampling.BICUBIC)
    if mode == "pad":
        side = max(image.size)
        canvas = Image.new("RGB", (side, side))
        canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
        return canvas
    return image


def load_rgb(path: str | os.PathLike, size: int, mode: str = "resize") -> np.ndarray:
    """Decodes `path`, applies EXIF orientation, converts to RGB and resizes (antialiased) to size x size.

    Args:
        path: An image file; its content decides the format, not its suffix.
        size: Side of the square output.
        mode: "resize" (ignore aspect ratio), "crop" (centre crop to a square first) or "pad".

    Returns:
        A uint8 array of shape (size, size, 3).

    Raises:
        ImageError: the file is empty, not an image, or corrupt or truncated.
    """
    if mode not in RESIZE_MODES:
        raise ValueError(f"mode must be one of {RESIZE_MODES}. Received: mode={mode}")
    special = special_file_reason(Path(path))
    if special is not None:
        raise ImageError(special)  # never opened: a FIFO would block the read
    try:
        size_on_disk = os.path.getsize(path)
    except OSError as error:
        raise ImageError(f"cannot read it ({error.strerror})") from None
    if size_on_disk == 0:
        raise ImageError("empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()  # decode now: truncated data fails here, not later
                image = ImageOps.exif_transpose(image)
                image = _square(_to_rgb(image), mode)
                return np.asarray(image.resize((size, size), Image.Resampling.BICUBIC), dtype=np.uint8)
    except UnidentifiedImageError:
        raise ImageError("not an image Pillow can read") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageError(f"decompression bomb: {error}") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageError(f"corrupt or truncated image ({error})") from None


def special_file_reason(path: Path) -> str | None:
    """Why `path` is not a readable file (broken symlink, symlink loop, FIFO, socket, device), or None for a
    regular file."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        if not path.is_symlink():
            return "cannot be read"
        return "symlink loop" if error.errno == errno.ELOOP else "broken symlink"
    if stat.S_ISREG(mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file (socket or device)"


def list_images(folder: str | os.PathLike) -> list[Path]:
    """Every entry below `folder` that is not a folder, sorted by path.

    Files are not filtered by name: a PNG named .jpg or a JPEG without a suffix
    still counts, and Thumbs.db or any other non-image, a broken symlink or a FIFO
    is reported by `load_rgb` with its reason rather than silently ignored.
    """
    return sorted(path for path in Path(folder).rglob("*") if not path.is_dir())


def encode_file(path: str, size: int, mode: str, format: str, quality: int = 95) -> tuple[bytes | None, str | None]:
    """(image bytes, None) or (None, reason): raw RGB pixels or a JPEG, for the converter's worker processes."""
    try:
        pixels = load_rgb(path, size, mode)
    except ImageError as error:
        return None, str(error)
    if format == "raw":
        return pixels.tobytes(), None
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), None
