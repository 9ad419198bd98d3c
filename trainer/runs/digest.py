"""Whole-file SHA-256 of the data a run reads, computed in a background thread while the first epoch trains.

    python run.py resume=RUN     # refused before its first epoch commits if any byte of the data changed

A run's `data.json` records each split's files by name, size and a sampled checksum
(`trainer.data.module.fingerprint`): cheap enough to check at once, but blind to a change
between the samples. So the run also hashes every byte of its files, in a thread that
shares the first epoch with training, and the first epoch-end waits for it
(`DigestGate`): a new run records the digests in `data.json`; a resumed run compares them
and stops before that epoch is committed if they differ. The files are read through
`tf.io.gfile` (local, `gs://`, `ram://`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

import keras
import tensorflow as tf

from trainer.errors import ConfigError, DataError
from trainer.runs.atomic import write_json

log = logging.getLogger(__name__)

CHUNK = 4 << 20  # bytes read at a time
KEY = "sha256"  # data.json: [[file name, size, digest], ...] in the order of the files read


def file_sha256(path: str) -> str:
    """SHA-256 of a whole file (any `tf.io.gfile` path)."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class FileDigests:
    """Hashes `paths` in a daemon thread from construction on; `wait` returns [[name, size, digest], ...]."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._result: list | None = None
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, name="vggtrain-data-digest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rows = []
        for path in self.paths:
            try:
                rows.append([Path(path).name, tf.io.gfile.stat(path).length, file_sha256(path)])
            except (OSError, tf.errors.OpError) as error:
                self._error = f"{path}: cannot be read to check the data ({getattr(error, 'message', error)})"
                return
        self._result = rows

    def wait(self) -> list:
        """The digests, once every file is hashed.

        Raises:
            DataError: a file could not be read.
        """
        self._thread.join()
        if self._error:
            raise DataError(self._error)
        return self._result


class DigestGate(keras.callbacks.Callback):
    """At the first epoch end, before anything of that epoch is saved (it must come first among the
    callbacks): records the data's digests (a new run) or checks them against `data.json` (a resumed run).

    Raises (from `on_epoch_end`):
        ConfigError: a resumed run's data differs in a byte the sampled checksum did not read.
    """

    def __init__(self, digests: FileDigests, data_file: Path | None, resume: str | None, allow_change: bool):
        super().__init__()
        self.digests, self.data_file, self.resume, self.allow_change = digests, data_file, resume, allow_change
        self.done = False

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if self.done:
            return
        self.done = True
        current = self.digests.wait()
        recorded = json.loads(self.data_file.read_text()) if self.data_file else None
        before = (recorded or {}).get(KEY)
        if self.resume and before is not None and before != current:
            changed = next((now[0] for was, now in zip(before, current, strict=False) if was != now), "a file")
            if not self.allow_change:
                raise ConfigError(
                    f"resume={self.resume}: {changed} has other content than the run trained on (its whole-file "
                    f"checksum differs); point dataset.data_dir at that data, or continue on this data with "
                    f"allow_data_change=true"
                )
            log.warning("Resumed on other data than the run trained on (%s) <allow_data_change=true>", changed)
        if recorded is not None and before != current:
            write_json(self.data_file, {**recorded, KEY: current})
