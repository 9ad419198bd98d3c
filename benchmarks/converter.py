"""Converter rows: `python -m trainer.convert` with every core against one, beside the ceiling the cores set.

python -m benchmarks --only converter
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.common import TRAINING_ROUNDS, Row


def _photos(folder: Path, count: int) -> Path:
    from PIL import Image

    root = folder / "photos"
    if not root.exists():
        rng = np.random.default_rng(0)
        gradient = np.linspace(0, 200, 500 * 375 * 3).reshape(375, 500, 3)
        for label, name in enumerate(("Cat", "Dog")):
            (root / name).mkdir(parents=True)
            for index in range(count // 2):
                pixels = np.clip(gradient + rng.normal(0, 25, gradient.shape) + label * 30, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / name / f"{index}.jpg", quality=90)
    return root


def _decode_rate(files: list[str], parallel: int) -> float:
    """Images/s of the converter's decode alone (`trainer.data.images.decode_files`: tf.data, `parallel` images
    at once), writing nothing."""
    from trainer.data.images import decode_files

    started = time.perf_counter()
    for _ in decode_files(files, 224, parallel=parallel):
        pass
    return len(files) / (time.perf_counter() - started)


def _decode_ceiling(photos: Path, workers: int, rounds: int) -> tuple[float, float]:
    """(workers, 1) images/s of the bare decode and resize: `workers` images at once against one. What the cores
    give this work with no converter around it (no scan, no split, no writing)."""
    files = sorted(str(path) for path in photos.rglob("*.jpg"))
    _decode_rate(files[:8], workers)  # traced
    rates = {1: [], workers: []}
    for _ in range(rounds):
        rates[1].append(_decode_rate(files[: len(files) // 2], 1))
        rates[workers].append(_decode_rate(files, workers))
    return max(rates[workers]), max(rates[1])


def converter(folder: Path, quick: bool) -> list[Row]:
    from trainer.data.folder_to_records import ConvertOptions, convert

    count = 60 if quick else 3000  # enough that starting the worker processes (~0.5 s, spawn) weighs little
    photos = _photos(folder, count)
    many = os.cpu_count() or 1
    # Alternating rounds, best of each: one round each let this machine's noise through (1.64 once, 1.81-1.92 else).
    rates = {1: [], many: []}
    for round in range(1 if quick else TRAINING_ROUNDS):
        for workers in rates:
            output = folder / f"converted_{workers}_{round}"
            started = time.perf_counter()
            # 100 records per shard: 30 shards, as a 25,000-image folder at the default 1,000 gives 25; each
            # worker writes whole shards, so 3 shards over 2 workers would measure the split, not the converter.
            convert(photos, output, ConvertOptions(image_size=224, workers=workers, records_per_shard=100))
            rates[workers].append(count / (time.perf_counter() - started))
            shutil.rmtree(output)
    ceiling = _decode_ceiling(photos, many, 1 if quick else TRAINING_ROUNDS)
    scaling = Row(
        f"Converter: {many} workers vs 1 (500x375 JPEG -> 224 raw)", max(rates[many]), max(rates[1]), "img/s", None
    )
    bare = Row(f"  ceiling: bare decode+resize, {many} at once vs 1 (no converter)", *ceiling, "img/s", None)
    # The target is on the converter's share of what the cores give: a busy machine lowers both scalings
    # (1.9x on a quiet hour, 1.4x on a busy one), the converter's overhead shows in their quotient.
    return [
        scaling,
        bare,
        Row("  the converter's scaling / the ceiling's", scaling.ratio, bare.ratio, "x", 0.9),
    ]
