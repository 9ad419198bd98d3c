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
A full disk is one warning, and training goes on uncached. `dataset=folder` decodes every
photo at start-up to find those that give no image; on disk those pixels are saved as the
entries themselves (`save_decoded`, `Cache.publish`), so the first epoch decodes none again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

log = logging.getLogger(__name__)

MODES = ("auto", "memory", "disk", "off")
MANIFEST = "vggtrain-cache.json"  # written last inside the folder, before the rename: a folder without it is no cache
_PARTIAL = ".partial"
_HELD: dict[str, tuple] = {}  # memory: (images, labels) decoded already, by key name (`hold`)
_REFUSED: dict[Path, str] = {}  # disk cache folders that refused a write in this load of the data: why (`_refused`)


def forget_refusals() -> None:
    """A new load of the data (a run, a sweep's trial) tries every cache folder again and warns anew."""
    _REFUSED.clear()


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

    def publish(self, partial: Path | None, ranges: list, count: int) -> None:
        """Names `partial` (`save_decoded`: the `count` images of `ranges`, decoded already) as the disk entry of
        `ranges`, which later runs and this one's first epoch read."""
        key = self.key(ranges)
        _publish(partial, Path(self.folder or default_folder()) / key_name(key), key, count)

    def keep(self, decoded: tf.data.Dataset, ranges: list, count: int) -> tf.data.Dataset:
        """`decoded`, the (image, label) of each of the `count` records of `ranges`, kept as this cache says."""
        if self.mode == "memory":
            import tensorflow as tf

            held = _HELD.get(key_name(self.key(ranges)))
            return tf.data.Dataset.from_tensor_slices(held) if held else decoded.cache()
        if self.mode == "disk":
            return _on_disk(decoded, Path(self.folder or default_folder()), self.key(ranges), count)
        return decoded


def hold(decoded: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> None:
    """Hands images decoded already (`dataset=folder`'s start-up check: batches of uint8 images and int32 labels,
    by key name) to the memory caches of their keys, in place of what the last call held: within one run, the
    first epoch reads them instead of decoding each photo again."""
    import tensorflow as tf

    _HELD.clear()
    for name, batches in decoded.items():
        if batches:
            _HELD[name] = tuple(tf.concat([batch[part] for batch in batches], 0) for part in (0, 1))


def identity_of(fingerprint: dict, image_size: int, resize_mode: str, stamp: str | None = None) -> dict:
    """What determines a cache's pixels besides its records: the data's fingerprint (the one a resume checks), the
    side the images are resized to and how they are made square, and the part's `stamp` of its files' contents
    where the fingerprint cannot see them (a photo rewritten at the same size)."""
    identity = {"data": fingerprint, "image_size": image_size, "resize_mode": resize_mode}
    return identity if stamp is None else {**identity, "stamp": stamp}


def decoded_bytes(records: int, side: int) -> int:
    """The size of `records` decoded images of `side` x `side` RGB: what `dataset.cache_memory_mb` is held against
    (the train and val splits, read every epoch)."""
    return records * side * side * 3


def resolved(mode: str, photos: bool, image_bytes: int, memory_mb: float) -> str:
    """The cache `dataset.cache=mode` means for data of `image_bytes` decoded (`photos`: compressed records, whose
    decode is the cost): `auto` is memory under `memory_mb`, else disk, and nothing for raw pixels."""
    if mode != "auto":
        return mode
    if not photos:
        return "off"
    return "memory" if image_bytes <= memory_mb * 2**20 else "disk"


def choose(mode: str, photos: bool, image_bytes: int, memory_mb: float, folder: str | None, identity: dict) -> Cache:
    """The `Cache` of `resolved(mode, ...)`, keyed by `identity`; `auto`'s choice is logged."""
    chosen = resolved(mode, photos, image_bytes, memory_mb)
    if mode == "auto" and photos:
        log.info(
            "Decoded images kept in %s: %.0f MB of them, dataset.cache_memory_mb=%g <dataset.cache=auto>",
            "memory" if chosen == "memory" else f"a disk cache under {folder or default_folder()}",
            image_bytes / 2**20,
            memory_mb,
        )
    return Cache(chosen, folder, identity)


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

    final = root / key_name(key)
    if not _complete(final) and root in _REFUSED:  # warned once already: the other splits go on uncached too
        return decoded
    if not _complete(final):
        partial = _partial_folder(root)
        if partial is None:
            return decoded  # the disk refused (one warning): decoded every epoch, as without a cache
        # Said once the folder took a write: a cache folder that cannot be written never reads "Decoding into".
        log.info("Decoding %d images once into the cache %s <dataset.cache=disk>", count, final)
        if not _publish(_save(decoded, root, partial), final, key, count):
            return decoded  # the disk refused part way: decoded every epoch, as without a cache
    else:
        log.info("Decoded images read from the cache %s (%d images) <dataset.cache=disk>", final, count)
    loaded = tf.data.Dataset.load(str(final), element_spec=decoded.element_spec)
    return loaded.apply(tf.data.experimental.assert_cardinality(count))


def save_decoded(batches: Iterator[tuple[np.ndarray, np.ndarray]], size: int, folder: str | None) -> Path | None:
    """Pixels decoded before their key is known, kept as a cache entry will hold them: `batches` of (uint8 images
    [n, size, size, 3], int32 labels [n]) saved under a partial name in `folder` (the default: `default_folder`),
    then named by `Cache.publish`. `dataset=folder`'s start-up check decodes every photo before the data's
    fingerprint, part of the key, is whole. Every batch is drawn here, in the caller's thread (Ctrl-C stops it
    at once), and handed to a writer thread; also when the disk refuses (None, one warning).
    """
    import tensorflow as tf

    handed, outcome = queue.Queue(maxsize=2), []  # a batch or two ahead of the writer; None: the last was handed

    def handed_over():
        while (batch := handed.get()) is not None:
            yield batch

    def write():
        try:
            outcome.append(_save(dataset, Path(folder or default_folder())))
        except Exception as error:  # raised again in the caller's thread
            outcome.append(error)

    spec = (tf.TensorSpec([None, size, size, 3], tf.uint8), tf.TensorSpec([None], tf.int32))
    dataset = tf.data.Dataset.from_generator(handed_over, output_signature=spec).unbatch()
    writer = threading.Thread(target=write, name="vggtrain-cache-writer")
    writer.start()
    drawn = False
    try:
        for batch in batches:
            _hand(handed, writer, batch)
        drawn = True
    finally:
        _hand(handed, writer, None)
        writer.join()
        saved = outcome[0] if outcome else None
        if not drawn and isinstance(saved, Path):  # stopped part way: some photos' pixels only, never named
            shutil.rmtree(saved, ignore_errors=True)
    if isinstance(saved, Exception):
        raise saved
    return saved


def _hand(handed: queue.Queue, writer: threading.Thread, item) -> None:
    """Puts `item` in the writer's queue while the writer runs (a writer the disk stopped takes nothing more)."""
    while writer.is_alive():
        with contextlib.suppress(queue.Full):
            handed.put(item, timeout=0.1)
            return


def _partial_folder(root: Path) -> Path | None:
    """A new, empty partial folder in `root`, whose name only this writer uses; None (one warning per folder)
    when the disk refuses it."""
    partial = root / f".pending.{os.getpid()}.{uuid.uuid4().hex[:8]}{_PARTIAL}"  # the pid: `_remove_leftovers`
    if root in _REFUSED:  # warned once already (the folder check's batches go on without the writer)
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        partial.mkdir()
    except OSError as error:
        _refused(partial, root, error)
        return None
    return partial


def _save(decoded: tf.data.Dataset, root: Path, partial: Path | None = None) -> Path | None:
    """`decoded` saved in `partial` (a new one of `_partial_folder` when None) in `root`; None (one warning) when
    the disk refuses."""
    import tensorflow as tf

    partial = partial or _partial_folder(root)
    if partial is None:
        return None
    try:
        # One shard: the cache reads back in the order it was written (an evaluation's order, a seed's shuffle).
        decoded.save(str(partial), shard_func=lambda *_: tf.constant(0, tf.int64))
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError):
        shutil.rmtree(partial, ignore_errors=True)
        raise  # a bad record: the data's error, not the disk's
    except (OSError, tf.errors.OpError) as error:
        _refused(partial, root, error)
        return None
    return partial


def _publish(partial: Path | None, final: Path, key: dict, count: int) -> bool:
    """Names the whole entry `partial` as `final`: its manifest last inside it, then the rename. Another run that
    finished the same key first wins: ours is dropped. False (one warning) when the disk refuses."""
    if partial is None:
        return False
    try:
        if final.exists() and not _complete(final):  # not one of ours (every cache gets its manifest before its name)
            shutil.rmtree(final, ignore_errors=True)
        manifest = {**key, "images": count, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            partial.rename(final)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not _complete(final):
                raise
            log.info("Another run wrote the cache %s first: using it", final)
            shutil.rmtree(partial, ignore_errors=True)
    except OSError as error:
        _refused(partial, final.parent, error)
        return False
    log.info("Cached %d images: %s", count, final)
    return True


def _cause(message: str) -> str:
    """The cause at the end of a TensorFlow error's first line ("No space left on device"), without the name of
    the function that raised it (`{{function_node __wrapped__SaveDataset...}}`)."""
    first = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", (message.splitlines() or [""])[0])
    return first if len(first) <= 200 else "..." + first[-197:]


def _refused(partial: Path, root: Path, error: Exception) -> None:
    """Removes `partial`; one warning per folder, then every split goes on uncached (each split's write of that
    folder printed it again: five lines in one run of a folder of photos, found by the red team)."""
    shutil.rmtree(partial, ignore_errors=True)
    reason = os.strerror(error.errno) if getattr(error, "errno", None) else _cause(str(error))
    if root in _REFUSED:
        return
    _REFUSED[root] = reason
    log.warning(
        "dataset.cache: could not write the cache under %s (%s); training goes on without it, decoding every "
        "epoch <dataset.cache_dir=%s>", root, reason, root,
    )  # fmt: skip
