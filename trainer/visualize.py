"""Pictures a person can read at a glance: contact sheets of what the pipeline yields, and training curves.

python run.py mode=inspect inspect.split=train inspect.augmented=true   # contact_sheet.png
python run.py                                                           # curves.png, redrawn as epochs end
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


def draw_curves(
    rows: list[dict[str, str]],
    path: str | os.PathLike,
    title: str = "",
    monitor: str = "val_accuracy",
    mode: str = "max",
) -> Path | None:
    """Loss (log scale), accuracy and learning rate per epoch, train and validation, with the best epoch by
    `monitor` marked; None before the first epoch. No pyplot, so it is safe outside the main thread.

    Epochs are numbered from 1 by row, whatever history.csv's own epoch column counts from.
    """
    if not rows:
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = list(range(1, len(rows) + 1))

    def column(name: str) -> list[float] | None:
        return [float(row[name]) for row in rows] if name in rows[0] else None

    panels = [("loss", ("loss", "val_loss")), ("accuracy", ("accuracy", "val_accuracy"))]
    if column("learning_rate") is not None:
        panels.append(("learning rate", ("learning_rate",)))
    best = None
    if (values := column(monitor)) is not None:
        best = values.index((max if mode == "max" else min)(values))
    figure = Figure(figsize=(5 * len(panels), 4), dpi=100)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (label, names) in zip(axes, panels, strict=True):
        for name in names:
            values = column(name)
            if values is None:
                continue
            style = "--s" if name.startswith("val_") else "-o"
            axis.plot(epochs, values, style, label=name, markersize=3)
            if best is not None and name == monitor:
                axis.plot(epochs[best], values[best], "*", color="crimson", markersize=14, label=f"best: {monitor}")
        if label == "loss":
            shown = [float(row[name]) for name in names if name in rows[0] for row in rows]
            if shown and min(shown) > 0:
                axis.set_yscale("log")  # a first-epoch val_loss in the thousands would flatten the rest
        if best is not None:
            axis.axvline(epochs[best], color="crimson", alpha=0.3, linestyle=":")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("epoch")
        axis.set_title(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    best_text = f", best epoch {epochs[best]} by {monitor}" if best is not None else ""
    figure.suptitle(f"{title}{best_text}" if title else best_text.lstrip(", "))
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
    return Path(path)
