"""Files a run leaves behind, each written atomically: a temporary file, then a rename.

A kill in the middle of a write leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path` (same suffix) and renames it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(handle)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Calls `write(temporary_path)`, then renames the result onto `path`."""
    with atomic_path(path) as temporary:
        write(temporary)
    return Path(path)


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Writes `data` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return write_atomic(path, lambda temporary: temporary.write_text(text))
