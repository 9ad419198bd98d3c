"""Pictures a person can read at a glance: contact sheets of what the pipeline yields, and training curves.

python run.py mode=inspect inspect.split=train inspect.augmented=true   # contact_sheet.png
python run.py                                                           # curves.png, updated every epoch
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from trainer.reports import write_atomic

CAPTION = 14  # pixels of caption band under each tile
GAP = 2  # pixels between tiles


def sheet_layout(count: int, tile: int) -> tuple[int, int, int]:
    """(columns, cell width, cell height) of a contact sheet of `count` square tiles."""
    columns = max(1, math.ceil(math.sqrt(count)))
    return columns, tile + GAP, tile + CAPTION + GAP


def tile_origin(index: int, count: int, tile: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of tile `index`."""
    columns, width, height = sheet_layout(count, tile)
    return (index % columns) * width, (index // columns) * height


def contact_sheet(images: np.ndarray, captions: list[str], min_tile: int = 64) -> Image.Image:
    """A grid of uint8 images (each enlarged by an integer factor to at least `min_tile`), captioned below."""
    count, size = len(images), images.shape[1]
    tile = size * max(1, math.ceil(min_tile / size))
    columns, width, height = sheet_layout(count, tile)
    rows = math.ceil(count / columns)
    sheet = Image.new("RGB", (columns * width, rows * height), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for index, (image, caption) in enumerate(zip(images, captions, strict=True)):
        x, y = tile_origin(index, count, tile)
        sheet.paste(Image.fromarray(image).resize((tile, tile), Image.Resampling.NEAREST), (x, y))
        draw.text((x + 1, y + tile + 1), caption[: max(4, tile // 6)], fill="black", font=font)
    return sheet


def save_png(image: Image.Image, path: str | os.PathLike) -> Path:
    return write_atomic(path, lambda temporary: image.save(temporary, format="PNG"))


def read_history(history_csv: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of history.csv (one per epoch)."""
    with open(history_csv, newline="") as handle:
        return list(csv.DictReader(handle))


def draw_curves(rows: list[dict[str, str]], path: str | os.PathLike) -> Path | None:
    """Loss and accuracy per epoch, train and validation; None before the first epoch. No pyplot, so
    it is safe outside the main thread."""
    if not rows:
        return None
    from matplotlib.figure import Figure

    epochs = [int(row["epoch"]) for row in rows]  # history.csv counts from 1
    figure = Figure(figsize=(10, 4), dpi=100)
    axes = figure.subplots(1, 2)
    for axis, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for prefix, style in (("", "-o"), ("val_", "--s")):
            name = prefix + metric
            if name in rows[0]:
                axis.plot(epochs, [float(row[name]) for row in rows], style, label=name, markersize=3)
        axis.set_xlabel("epoch")
        axis.set_title(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
    return Path(path)
