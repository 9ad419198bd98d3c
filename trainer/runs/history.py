"""history.csv, the one record of a run's epochs: one row per epoch, numbered from 1 like the log.

    python run.py                    # RUN/history.csv gains a row as each epoch ends
    python run.py resume=RUN         # trimmed to the epochs the backup holds, then appended to

Every reader of the file goes through `read_rows`: the curves, the resume, the best
checkpoint's starting value and the final metrics. Rows are added by rewriting the
small file atomically, so it never holds half a row, even on a full disk.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from trainer.runs.atomic import write_atomic

FILE = "history.csv"


def read_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of history.csv as written (strings), [] before the first epoch ends."""
    if not Path(path).is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def columns(rows: list[dict[str, str]]) -> dict[str, list[float]]:
    """The rows as columns of floats (an empty cell, a metric absent in some epochs, becomes NaN)."""
    if not rows:
        return {}
    return {name: [float(row.get(name) or "nan") for row in rows] for name in rows[0]}


def best_index(values: list[float], mode: str, tolerance: float = 0.0) -> int:
    """The index of the best value: the first of the largest for `mode="max"` (else the smallest); with a
    `tolerance`, the last within it of that value (a later epoch, trained longer, wins a near-tie)."""
    peak = (max if mode == "max" else min)(values)
    if not tolerance:
        return values.index(peak)
    return max(index for index, value in enumerate(values) if improves(value, peak, mode, tolerance))


def improves(value: float, best: float, mode: str, tolerance: float = 0.0) -> bool:
    """Whether an epoch's `value` takes the place of the `best` so far: better, or with a `tolerance`, within it."""
    if mode == "max":
        return value > best or (tolerance > 0 and value >= best - tolerance)
    return value < best or (tolerance > 0 and value <= best + tolerance)


def best_value(path: str | os.PathLike, monitor: str, mode: str) -> float | None:
    """The best `monitor` value so far (a resumed run continues from it), or None without one."""
    values = [float(row[monitor]) for row in read_rows(path) if row.get(monitor)]
    return values[best_index(values, mode)] if values else None


def append_row(path: str | os.PathLike, row: dict[str, float | int]) -> None:
    """Adds one row, widening the header if the row brings a new column; atomic."""
    rows = read_rows(path)
    header = list(rows[0]) if rows else []
    _write(path, header + [name for name in row if name not in header], [*rows, row])


def _epoch(row: dict[str, str]) -> int:
    """A row's epoch number; a torn row (no number) counts as not done."""
    try:
        return int(row.get("epoch") or "")
    except ValueError:
        return 1 << 30


def trim(path: str | os.PathLike, epochs: int) -> None:
    """Keeps only the rows of epochs 1..`epochs` (those a backup holds), so no epoch appears twice."""
    rows = read_rows(path)
    kept = [row for row in rows if _epoch(row) <= epochs]
    if kept != rows:
        _write(path, list(rows[0]), kept)


def _write(path: str | os.PathLike, header: list[str], rows: list[dict]) -> None:
    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=header, restval="")
            writer.writeheader()
            writer.writerows(rows)

    write_atomic(path, write)
