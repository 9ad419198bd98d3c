"""Start-up checks of a dataset part written outside vggtrain (`dataset=custom`): each broken promise is one line.

    python run.py dataset=custom dataset._target_=my_package.MySource

The built-in parts keep the protocol of `trainer.data.parts` by construction; a part of
yours is held to it once, before the first step, instead of failing after training (in
the report) or, worse, training on something else than it meant:

- an exception raised in its `load()` is one line naming the part, not the whole stack;
- its reader gives exactly the records its `Records` count, for every split: a reader that
  never ends (or ends early) is named, not met at the report's `assert_cardinality`
  (every record is read once, none decoded);
- its decoder gives uint8 images [n, height, width, 3] and integer labels in range: float
  images in [0, 1] would be cast to near-black pixels and trained on silently. A decoder that
  offers `checked(records)` is checked through it: (images, labels, a string reason per record),
  and the records it gives a reason are left to each caller's policy (training names the first
  as `FILE: record N REASON`), not refused here.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from trainer.data.parts import DatasetPart, Splits
from trainer.errors import DataError, UserError, one_line

log = logging.getLogger(__name__)

BUILT_IN = "trainer."  # the targets of the built-in parts start with it
FIRST_BATCH = 16  # records decoded at start-up to check what the decoder gives


def is_own(target: str) -> bool:
    """Whether `dataset._target_` names a part outside vggtrain."""
    return not str(target).startswith(BUILT_IN)


def load(part: DatasetPart, target: str, check_val: bool) -> Splits:
    """`part.load(check_val)`, checked: see the module docstring.

    Raises:
        DataError: one line naming `dataset._target_` and what it broke; the part's own `UserError` passes
            through as it is.
    """
    try:
        splits = part.load(check_val)
    except UserError:
        raise
    except Exception as error:  # the part's own code: any failure is its one line
        raise DataError(f"dataset._target_={target}: its load() raised {one_line(error)}") from error
    if not isinstance(splits, Splits):
        raise DataError(
            f"dataset._target_={target}: its load() returned {type(splits).__name__}; expected "
            f"trainer.data.parts.Splits (docs/extending.md)"
        )
    _check_counts(splits, target)
    _check_first_batch(splits, target)
    return splits


def _check_counts(splits: Splits, target: str) -> None:
    """Each split's reader gives exactly the records its `Records` count (read up to one past it)."""
    checked = set()
    for split, source in splits.sources.items():
        if id(source) in checked:
            continue
        checked.add(id(source))
        try:
            records = source.for_training(0).take(source.count + 1)
            read = int(records.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
        except Exception as error:
            raise DataError(
                f"dataset._target_={target}: its reader failed on the {split} split: {one_line(error)}"
            ) from None
        if read != source.count:
            more = read > source.count
            raise DataError(
                f"dataset._target_={target}: its reader gives {'more than ' if more else ''}{min(read, source.count)}"
                f" records of the {split} split{' (it never ends?)' if more else ''}, but its Records count "
                f"{source.count}; expected exactly that many"
            )


def _check_first_batch(splits: Splits, target: str) -> None:
    """The decoder gives uint8 images [n, height, width, 3] of 0-255 and integer labels of the classes (those of
    the records its `checked` gives no reason)."""
    train, checked = splits.sources["train"], getattr(splits.decoder, "checked", None)
    try:
        records = train.for_training(0).map(lambda file, number, record: record)
        batch = records.take(FIRST_BATCH).batch(FIRST_BATCH).map(checked or splits.decoder)
        images, labels, *reasons = next(iter(batch))
    except Exception as error:
        reason = one_line(error)
        raise DataError(f"dataset._target_={target}: its decoder failed on the first batch: {reason}") from None
    if checked and (len(reasons) != 1 or reasons[0].dtype != tf.string or reasons[0].shape != labels.shape):
        raise DataError(
            f"dataset._target_={target}: its decoder's checked() gives {len(reasons) + 2} values; expected "
            f"(images, labels, reasons): a string per record, '' for a good one (docs/extending.md)"
        )
    if checked:
        good = reasons[0].numpy() == b""
        images, labels = tf.boolean_mask(images, good), tf.boolean_mask(labels, good)
    pixels = images.numpy()
    low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    if images.dtype != tf.uint8:
        raise DataError(
            f"dataset._target_={target}: its decoder gives {images.dtype.name} images (values {low:.4g} to "
            f"{high:.4g} in the first batch); expected uint8 0-255, e.g. tf.cast(images * 255, tf.uint8) for floats "
            f"in [0, 1]"
        )
    if images.shape.rank != 4 or images.shape[-1] != 3:
        raise DataError(
            f"dataset._target_={target}: its decoder gives images of shape {images.shape.as_list()}; expected "
            f"[batch, height, width, 3] (uint8 RGB)"
        )
    if high <= 1:
        log.warning(
            "dataset._target_=%s: the first batch's pixels are all 0 or 1 of 0-255: images scaled to [0, 1] "
            "before a cast to uint8 train on black; multiply by 255 first",
            target,
        )
    values, classes = labels.numpy(), len(splits.class_names)
    if not np.issubdtype(values.dtype, np.integer) or values.ndim != 1:
        raise DataError(
            f"dataset._target_={target}: its decoder gives {labels.dtype.name} labels of shape "
            f"{labels.shape.as_list()}; expected integer class indices [batch]"
        )
    outside = values[(values < 0) | (values >= classes)]
    if len(outside):
        raise DataError(
            f"dataset._target_={target}: its decoder gives label {int(outside[0])}, outside the {classes} classes "
            f"{splits.class_names[:5]}{' ...' if classes > 5 else ''}"
        )
