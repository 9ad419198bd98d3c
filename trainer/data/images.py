"""Image files to pixels in `tf.data`, in input order, with the reason for each file that gives none.

    python run.py mode=predict checkpoint=RUN predict.input=photos/      # predict on files
    python run.py dataset=folder dataset.data_dir=photos/                # the start-up check of a folder
    python -m trainer.convert PetImages/ records/                        # the converter

Real photo folders (the PetImages set among them) hold EXIF-rotated, grayscale, palette,
transparent and CMYK images, PNGs named `.jpg`, and truncated, empty or non-image files,
`Thumbs.db`, broken symlinks and FIFOs. Every file is decoded by `trainer.data.decode`
inside a parallel, order-keeping `tf.data` map; one that fails is dropped there and,
afterwards, decoded once more eagerly for its reason (Python runs only for those). A
special file (FIFO, socket, broken link) is named by a `stat`, never opened: a FIFO would
block the read.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer.data.decode import MAX_PIXELS, decode_image
from trainer.data.headers import image_format, image_size
from trainer.errors import one_line

AUTOTUNE = tf.data.AUTOTUNE


def special_file_reason(path: Path) -> str | None:
    """Why `path` is not a readable file (broken symlink, symlink loop, FIFO, socket, device), or None for a
    regular file."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        if not path.is_symlink():
            return "cannot be read"
        return "symlink loop" if error.errno == errno.ELOOP else "broken symlink"
    if stat.S_ISREG(mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file (socket or device)"


def list_images(folder: str | os.PathLike) -> list[Path]:
    """Every entry below `folder` that is not a folder, sorted by path.

    Files are not filtered by name: a PNG named .jpg or a JPEG without a suffix
    still counts, and Thumbs.db or any other non-image, a broken symlink or a FIFO
    gets its reason from `decode_files` rather than being silently ignored.
    """
    return sorted(path for path in Path(folder).rglob("*") if not path.is_dir())


def reason_for(path: str, size: int, mode: str, max_pixels: int = MAX_PIXELS) -> str | None:
    """Why one file gives no image (decoded eagerly as the pipeline does), or None when it does."""
    special = special_file_reason(Path(path)) if "://" not in path else None
    if special is not None:
        return special
    try:
        data = tf.io.read_file(os.fsencode(path))  # a name that is not UTF-8 stays as it is
        if int(tf.strings.length(data)) == 0:
            return "empty file"
        decode_image(data, size, mode, max_pixels)
    except tf.errors.OpError as error:  # our own check's text (eager or in a graph), else a corrupt image
        message = getattr(error, "message", None) or str(error)
        ours = "Summarized data: b'" in message or "assertion failed: [" in message
        return one_line(error) if ours else f"corrupt or truncated image ({one_line(error)})"
    return None


@dataclass
class Decoded:
    """Consecutive input files [start, start + len(errors)): the images of those without an error, in order."""

    start: int
    errors: list[str | None]  # per file: None (its image is in `images`) or why it gives none
    images: np.ndarray | None  # uint8 [files without an error, size, size, 3]


def decode_files(
    paths: list[str],
    size: int,
    mode: str = "resize",
    batch_size: int = 64,
    max_pixels: int = MAX_PIXELS,
    parallel: int = 0,
) -> Iterator[Decoded]:
    """Every file of `paths` decoded to uint8 [size, size, 3] (`trainer.data.decode.decode_image`), in order.

    Args:
        paths: Local or `tf.io.gfile` paths.
        size: Side of the square images.
        mode: `resize`, `crop` or `pad`.
        batch_size: Images decoded before they are handed back.
        max_pixels: A larger image is refused before it is decoded.
        parallel: Files decoded at once; 0: one per core.

    Yields:
        `Decoded` runs that cover every input once, in order; a file that gives no image has its reason.
    """
    special = {
        index: reason
        for index, path in enumerate(paths)
        if "://" not in path and (reason := special_file_reason(Path(path))) is not None
    }
    readable = [index for index in range(len(paths)) if index not in special]
    if not readable:
        if paths:
            yield Decoded(0, [special[index] for index in range(len(paths))], None)
        return
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(readable, tf.int64), tf.constant([os.fsencode(paths[index]) for index in readable]))
    )
    images = files.map(
        lambda index, path: (index, decode_image(tf.io.read_file(path), size, mode, max_pixels)),
        num_parallel_calls=parallel or AUTOTUNE,
        deterministic=True,
    )
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False  # as in trainer.data.pipeline: no model thread to wait for at the end
    batches = images.ignore_errors().batch(batch_size).prefetch(1).with_options(options)

    def run(start: int, end: int, decoded: np.ndarray, pixels: np.ndarray | None) -> Decoded:
        kept = set(decoded.tolist())
        errors = [
            None if index in kept else special.get(index) or reason_for(paths[index], size, mode, max_pixels)
            for index in range(start, end)
        ]
        for index, error in enumerate(errors):  # decoded in the pipeline, refused eagerly: never dropped silently
            if error is None and start + index not in kept:
                errors[index] = "could not be decoded in the input pipeline"
        return Decoded(start, errors, pixels if pixels is not None and len(pixels) else None)

    start = 0
    for indices, pixels in batches:
        indices = indices.numpy()
        end = int(indices[-1]) + 1
        yield run(start, end, indices, pixels.numpy())
        start = end
    if start < len(paths):
        yield run(start, len(paths), np.zeros([0], np.int64), None)


def stored_sizes(paths: list[str]) -> dict[str, int]:
    """How many files have each "HEIGHTxWIDTH", read from their headers in tf.data, most frequent first (a WebP:
    "unknown"; a file that is no image is left out)."""

    def size(path):
        data = tf.io.read_file(path)
        return image_size(data, image_format(data))

    paths = tf.data.Dataset.from_tensor_slices([os.fsencode(path) for path in paths])
    sizes = paths.map(size, num_parallel_calls=AUTOTUNE, deterministic=True).ignore_errors().batch(1024)
    counts: dict[str, int] = {}
    for batch in sizes.as_numpy_iterator():
        for height, width in batch.tolist():
            key = f"{height}x{width}" if height and width else "unknown"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))
