"""Contact sheets: a grid of what the pipeline yields, each tile captioned with its label's class name.

python run.py mode=inspect inspect.split=train inspect.augmented=true   # contact_sheet.png
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from trainer.runs.atomic import write_atomic

CAPTION = 14  # pixels of caption band under each tile
GAP = 2  # pixels between tiles


def sheet_layout(count: int, tile: int, tile_width: int | None = None) -> tuple[int, int, int]:
    """(columns, cell width, cell height) of a contact sheet of `count` tiles `tile` high (and as wide, unless
    `tile_width`)."""
    columns = max(1, math.ceil(math.sqrt(count)))
    return columns, (tile_width or tile) + GAP, tile + CAPTION + GAP


def tile_origin(index: int, count: int, tile: int, tile_width: int | None = None) -> tuple[int, int]:
    """(x, y) of the top-left pixel of tile `index`."""
    columns, width, height = sheet_layout(count, tile, tile_width)
    return (index % columns) * width, (index // columns) * height


def contact_sheet(images: np.ndarray, captions: list[str], min_tile: int = 64) -> Image.Image:
    """A grid of uint8 images [n, height, width, 3] (each enlarged by an integer factor to at least `min_tile`
    high), captioned below."""
    count, factor = len(images), max(1, math.ceil(min_tile / images.shape[1]))
    tile, tile_width = images.shape[1] * factor, images.shape[2] * factor
    columns, width, height = sheet_layout(count, tile, tile_width)
    rows = math.ceil(count / columns)
    sheet = Image.new("RGB", (columns * width, rows * height), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for index, (image, caption) in enumerate(zip(images, captions, strict=True)):
        x, y = tile_origin(index, count, tile, tile_width)
        sheet.paste(Image.fromarray(image).resize((tile_width, tile), Image.Resampling.NEAREST), (x, y))
        draw.text((x + 1, y + tile + 1), caption[: max(4, tile_width // 6)], fill="black", font=font)
    return sheet


def note_image(text: str, width: int = 360, height: int = 60) -> Image.Image:
    """A white image saying `text` (a sheet with nothing to show)."""
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).text((8, height // 2 - 6), text, fill="black", font=ImageFont.load_default())
    return image


def save_png(image: Image.Image, path: str | os.PathLike) -> Path:
    return write_atomic(path, lambda temporary: image.save(temporary, format="PNG"))
