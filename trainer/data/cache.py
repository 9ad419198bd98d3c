"""Decoded once: `dataset.cache` keeps a split's decoded, resized uint8 images after their first decode.

    python run.py dataset=folder dataset.data_dir=photos           # auto: in memory if it fits, else on disk
    python run.py dataset=folder dataset.cache=disk dataset.cache_dir=/scratch/vggtrain
    python run.py mode=inspect dataset=folder dataset.data_dir=photos   # the cache's key, size and place

`auto` caches the formats whose records are compressed photos (a folder, Parquet, TFDS,
JPEG TFRecords): in memory when they fit under `dataset.cache_memory_mb`, else on disk
under `dataset.cache_dir`. Raw pixels (CIFAR `.bin`, raw TFRecords) are not cached:
reading them is already the floor. Augmentation comes after the cache, so each epoch
still draws new crops and flips.

A disk cache is keyed by what determines its pixels: the records it holds (the data's
fingerprint, the one a resume checks, and the file ranges of the split or of a worker's
share), the image size, the resize mode and the decode's version (`trainer.data.decode.DECODE`). A second run, and every
trial of a sweep, reads it from its first epoch; another file, size or mode is another
key. It is written under a temporary name and renamed, so a killed writer leaves nothing
a later run trusts, and of two runs writing one key at once the second keeps the first's.
A full disk is one warning, and training goes on uncached.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)

MODES = ("auto", "memory", "disk", "off")
MANIFEST = "vggtrain-cache.json"  # written last inside the folder, before the rename: a folder without it is no cache
_PARTIAL = ".partial"


def default_folder() -> str:
    """`$XDG_CACHE_HOME/vggtrain/decoded`, by default `~/.cache/vggtrain/decoded`."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "vggtrain", "decoded")


@dataclasses.dataclass(frozen=True)
class Cache:
    """Where a split's decoded images are kept: `memory`, `disk` (under `folder`) or `off`; `identity` is what
    besides the records determines their pixels (`identity_of`)."""

    mode: str = "off"
    folder: str | None = None
    identity: dict = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.mode != "off"

    def key(self, ranges: list) -> dict:
        """The key of the records of `ranges` (a split's, or a worker's share of it)."""
        shown = [[path.decode(errors="backslashreplace") if isinstance(path, bytes) else path, start, length]
                 for path, start, length in ranges]  # fmt: skip
        from trainer.data.decode import DECODE  # the one decode's name and version: other pixels, another key

        return {**self.identity, "ranges": shown, "decode": DECODE}

    def entry(self, ranges: list) -> dict:
        """What `mode=inspect` shows of the cache of `ranges`: its mode, and on disk its key, place, whether it is
        written yet and its size."""
        if self.mode != "disk":
            return {"mode": self.mode}
        name = key_name(self.key(ranges))
        place = Path(self.folder or default_folder()) / name
        size = sum(path.stat().st_size for path in place.rglob("*") if path.is_file()) if _complete(place) else 0
        return {"mode": "disk", "key": name, "place": str(place), "written": _complete(place), "bytes": size}

    def keep(self, decoded: tf.data.Dataset, ranges: list, count: int) -> tf.data.Dataset:
        """`decoded`, the (image, label) of each of the `count` records of `ranges`, kept as this cache says."""
        if self.mode == "memory":
            return decoded.cache()
        if self.mode == "disk":
            return _on_disk(decoded, Path(self.folder or default_folder()), self.key(ranges), count)
        return decoded


def identity_of(fingerprint: dict, image_size: int, resize_mode: str) -> dict:
    """What determines a cache's pixels besides its records: the data's fingerprint (the one a resume checks), the
    side the images are resized to and how they are made square."""
    return {"data": fingerprint, "image_size": image_size, "resize_mode": resize_mode}


def choose(mode: str, photos: bool, image_bytes: int, memory_mb: float, folder: str | None, identity: dict) -> Cache:
    """The cache `dataset.cache=mode` means for data of `image_bytes` decoded (`photos`: compressed records, whose
    decode is the cost); `auto` picks memory under `memory_mb`, else disk, and nothing for raw pixels."""
    if mode == "auto":
        if not photos:
            mode = "off"
        else:
            mode = "memory" if image_bytes <= memory_mb * 2**20 else "disk"
            log.info(
                "Decoded images kept in %s: %.0f MB of them, dataset.cache_memory_mb=%g <dataset.cache=auto>",
                "memory" if mode == "memory" else f"a disk cache under {folder or default_folder()}",
                image_bytes / 2**20,
                memory_mb,
            )
    return Cache(mode, folder, identity)


def key_name(key: dict) -> str:
    """The folder name of a key: 20 hex digits of its SHA-256."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def _complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def _remove_leftovers(root: Path) -> None:
    """Partial folders of writers that are gone (killed): their process no longer runs on this machine."""
    for partial in root.glob(f".*{_PARTIAL}"):
        pid = partial.name.split(".")[2] if partial.name.count(".") >= 4 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(partial, ignore_errors=True)


def _on_disk(decoded: tf.data.Dataset, root: Path, key: dict, count: int) -> tf.data.Dataset:
    import tensorflow as tf

    name = key_name(key)
    final = root / name
    if not _complete(final):
        if not _write(decoded, root, name, key, count):
            return decoded  # the disk refused: decoded every epoch, as without a cache
    else:
        log.info("Decoded images read from the cache %s (%d images) <dataset.cache=disk>", final, count)
    loaded = tf.data.Dataset.load(str(final), element_spec=decoded.element_spec)
    return loaded.apply(tf.data.experimental.assert_cardinality(count))


def _write(decoded: tf.data.Dataset, root: Path, name: str, key: dict, count: int) -> bool:
    """Decodes every image once into `root/name`, through a partial folder renamed when whole; False (and one
    warning) when the disk refuses. Another run that finished the same key first wins: ours is dropped."""
    import tensorflow as tf

    partial = root / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_PARTIAL}"
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        if (root / name).exists():  # no manifest: not one of ours (every cache gets its manifest before its name)
            shutil.rmtree(root / name, ignore_errors=True)
        log.info("Decoding %d images once into the cache %s <dataset.cache=disk>", count, root / name)
        # One shard: the cache reads back in the order it was written (an evaluation's order, a seed's shuffle).
        decoded.save(str(partial), shard_func=lambda *_: tf.constant(0, tf.int64))
        manifest = {**key, "images": count, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            partial.rename(root / name)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not _complete(root / name):
                raise
            log.info("Another run wrote the cache %s first: using it", root / name)
            shutil.rmtree(partial, ignore_errors=True)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError):
        shutil.rmtree(partial, ignore_errors=True)
        raise  # a bad record: the data's error, not the disk's
    except (OSError, tf.errors.OpError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        reason = os.strerror(error.errno) if getattr(error, "errno", None) else str(error).splitlines()[0][:200]
        log.warning(
            "dataset.cache: could not write the cache under %s (%s); training goes on without it, decoding every "
            "epoch <dataset.cache_dir=%s>", root, reason, root,
        )  # fmt: skip
        return False
    log.info("Cached %d images in %.1f s: %s", count, time.monotonic() - started, root / name)
    return True
