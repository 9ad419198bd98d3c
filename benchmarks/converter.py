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


def _encode_files(files: list[str]) -> int:
    """Decodes and resizes `files` as the converter's workers do, writing nothing (a pool task)."""
    from trainer.data.images import encode_file

    for file in files:
        encode_file(file, 224, "resize", "raw", 95)
    return len(files)


def _decode_ceiling(photos: Path, workers: int, rounds: int) -> tuple[float, float]:
    """(workers, 1) images/s of bare `encode_file` calls: `workers` pre-started processes against one. What the
    cores give this work with no converter around it (no scan, no writing, no process start-up)."""
    import multiprocessing

    files = sorted(str(path) for path in photos.rglob("*.jpg"))
    chunks = [files[start : start + 50] for start in range(0, len(files), 50)]
    rates = {1: [], workers: []}
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_encode_files, [files[:2]] * workers)  # started and imported
        for _ in range(rounds):
            started = time.perf_counter()
            _encode_files(files[: len(files) // 2])
            rates[1].append(len(files) // 2 / (time.perf_counter() - started))
            started = time.perf_counter()
            pool.map(_encode_files, chunks)
            rates[workers].append(len(files) / (time.perf_counter() - started))
    return max(rates[workers]), max(rates[1])


def converter(folder: Path, quick: bool) -> list[Row]:
    from trainer.data.convert import ConvertOptions, convert

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
    bare = Row(f"  ceiling: bare decode+resize, {many} processes vs 1 (no converter)", *ceiling, "img/s", None)
    # The target is on the converter's share of what the cores give: a busy machine lowers both scalings
    # (1.9x on a quiet hour, 1.4x on a busy one), the converter's overhead shows in their quotient.
    return [
        scaling,
        bare,
        Row("  the converter's scaling / the ceiling's", scaling.ratio, bare.ratio, "x", 0.9),
    ]
