"""The folder check's verdicts, kept: a photo decoded once at start-up is not decoded again by the next run.

    python run.py dataset=folder dataset.data_dir=photos/                 # the first run decodes every photo
    python run.py -m hparams_search=optuna dataset=folder dataset.data_dir=photos/   # each trial: none again

`dataset=folder` decodes every file once at start-up to leave out those that give no image
(`trainer.data.folder`). Its verdicts (None, or why a file gives no image) are kept beside the
decoded-image cache (`trainer.data.cache.default_folder`), in `$XDG_CACHE_HOME/vggtrain/checked/`,
one JSON file per folder, image size and resize mode, keyed by the decode's version
(`trainer.data.decode.DECODE`). Each file's verdict holds its size and modification time: a file
changed since is decoded again. A file is written under a temporary name and renamed, so a killed
writer leaves nothing that a later run reads, and of two runs writing at once each writes a whole
file (the later one's stays). Clearing it is `rm -r ~/.cache/vggtrain/checked`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import time
from pathlib import Path

from trainer.data.cache import default_folder
from trainer.data.decode import DECODE, MAX_PIXELS
from trainer.errors import DiskError
from trainer.runs.atomic import TEMPORARY_MARK, write_json

log = logging.getLogger(__name__)

UNSURE = "could not be decoded in the input pipeline"  # `trainer.data.images.decode_files`: not kept, tried again


def folder() -> Path:
    """`$XDG_CACHE_HOME/vggtrain/checked`, beside the decoded-image cache."""
    return Path(default_folder()).parent / "checked"


def stamp(path: Path) -> list[int] | None:
    """[size, modification time in ns] of a regular file, or None (a special file, a broken link: its reason
    costs no decode and is not kept)."""
    try:
        status = path.stat()
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns] if stat.S_ISREG(status.st_mode) else None


class Verdicts:
    """The kept verdicts of one folder decoded at one size and resize mode."""

    def __init__(self, root: Path, size: int, mode: str) -> None:
        key = {"root": os.fsencode(root.resolve()).hex(), "size": size, "mode": mode, "decode": DECODE}
        key["max_pixels"] = MAX_PIXELS
        self.path = folder() / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20] + ".json")
        self.key = key

    def read(self) -> dict[str, list]:
        """{file: [size, mtime_ns, reason or None]} as the last run left them; {} when none (or unreadable)."""
        try:
            kept = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return kept.get("files", {}) if isinstance(kept, dict) and kept.get("key") == self.key else {}

    def known(self, kept: dict[str, list], path: Path) -> tuple[bool, str | None]:
        """(whether `path`'s verdict is kept for the file as it is now, that verdict)."""
        entry, now = kept.get(_name(path)), stamp(path)
        if entry is None or now is None or entry[:2] != now:
            return False, None
        return True, entry[2]

    def write(self, kept: dict[str, list], checked: dict[Path, str | None]) -> None:
        """Adds the verdicts of `checked` to `kept` (re-read, so a run beside ours keeps its own) and writes them
        atomically; a disk that refuses is one warning (the next run decodes again)."""
        entries = {**kept, **self.read()}
        for path, reason in checked.items():
            now = stamp(path)
            if now is not None and reason != UNSURE:
                entries[_name(path)] = [*now, reason]
        with contextlib.suppress(OSError):  # writers killed before their rename left their temporary files
            for leftover in self.path.parent.glob(f".{self.path.name}{TEMPORARY_MARK}*"):
                if leftover.stat().st_mtime < time.time() - 3600:  # a live writer takes milliseconds
                    leftover.unlink(missing_ok=True)
        try:
            write_json(self.path, {"key": self.key, "files": entries})
        except (DiskError, OSError) as error:  # the check's result stands
            log.warning("Could not keep the folder check's verdicts in %s (%s): the next run decodes again", self.path,
                        error)  # fmt: skip


def _name(path: Path) -> str:
    """A file's key: its absolute path's bytes as hex when they are not UTF-8 (JSON holds text)."""
    raw = os.fsencode(path.absolute())
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "hex:" + raw.hex()
