"""k-fold cross-validation: `dataset.folds=K dataset.fold=I` makes fold I of the training records (the train and
val splits together) the validation split, and the other K-1 folds the training split.

    python run.py dataset.folds=5 dataset.fold=0
    python run.py -m dataset.folds=5 'dataset.fold=range(0,5)'     # the five folds; summary.csv: mean and std

The folds are stratified by class and fixed by `seed`: each class's records are shuffled
with the seed and dealt round-robin, so each fold holds its share of every class, and the
same for every source (the labels are read once, without decoding an image). The test
split is left alone; so is a validation split that is the test files (`val_source=test`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import tensorflow as tf

from trainer.data.parts import Splits
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import DataError


@dataclass(frozen=True)
class FoldSource:
    """The records of one or more sources read one after another (train, then val), or only those `keep`
    marks by their place: one fold, or all the others (`trainer.data.sources.Source`'s reading methods)."""

    parts: tuple[Source, ...]
    keep: np.ndarray | None = field(default=None, compare=False)  # bool per record of the parts, in order

    @property
    def records(self) -> Records:
        """Every range the parts read (the fingerprint's and the checksum's files)."""
        return Records(tuple(item for part in self.parts for item in part.records.ranges), self._total)

    @property
    def _total(self) -> int:
        return sum(part.count for part in self.parts)

    @property
    def count(self) -> int:
        return self._total if self.keep is None else int(self.keep.sum())

    def _read(self) -> tf.data.Dataset:
        records = self.parts[0].in_order()
        for part in self.parts[1:]:
            records = records.concatenate(part.in_order())
        if self.keep is None:
            return records
        mask = tf.constant(self.keep)
        chosen = records.enumerate().filter(lambda index, record: tf.gather(mask, index))
        return chosen.map(lambda index, record: record)

    def in_order(self) -> tf.data.Dataset:
        return self._read().apply(tf.data.experimental.assert_cardinality(self.count))

    def for_training(self, seed: int) -> tf.data.Dataset:
        """In file order (a record's place picks it); the pipeline's shuffle buffer mixes them."""
        return self._read()


def pooled(splits: Splits) -> FoldSource:
    """The records the folds are cut from: train, then val (unless val is the test files)."""
    train, val, test = splits.sources["train"], splits.sources["val"], splits.sources["test"]
    return FoldSource((train,) if val.records == test.records else (train, val))


def read_labels(source: FoldSource, decoder) -> np.ndarray:
    """Every record's label, in order: the decoder's `labels` where it has one (no image decoded)."""
    labels = getattr(decoder, "labels", None) or (lambda records: decoder(records)[1])
    labels_of = tf.autograph.experimental.do_not_convert(lambda files, numbers, records: labels(records))
    batches = source.in_order().batch(1024).map(labels_of, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    found = [batch.numpy() for batch in batches]
    return np.concatenate(found) if found else np.zeros([0], np.int32)


def assign_folds(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each record's fold: per class, its records shuffled by `seed` and dealt round-robin, each class starting
    where the last one stopped, so the folds differ in size by one record at most."""
    rng = np.random.default_rng(seed)
    assignment = np.empty(len(labels), np.int64)
    dealt = 0
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        assignment[members] = (dealt + np.arange(len(members))) % folds
        dealt += len(members)
    return assignment


def _class_counts(labels: np.ndarray, names: list[str]) -> dict[str, int]:
    found, counts = np.unique(labels, return_counts=True)
    return {names[label]: int(count) for label, count in zip(found, counts, strict=True)}


def fold_splits(splits: Splits, folds: int, fold: int, seed: int) -> Splits:
    """`splits` with fold `fold` of `folds` as the validation split and the others as the training split.

    Raises:
        DataError: fewer training records than folds.
    """
    source = pooled(splits)
    labels = read_labels(source, splits.decoder)
    if len(labels) < folds:
        raise DataError(f"dataset.folds={folds}: the training records ({len(labels)}) are fewer than the folds")
    assignment = assign_folds(labels, folds, seed)
    chosen = {"train": assignment != fold, "val": assignment == fold}
    sources = {**splits.sources, **{name: replace(source, keep=keep) for name, keep in chosen.items()}}
    names = splits.class_names
    counts = {name: _class_counts(labels[keep], names) for name, keep in chosen.items()}
    if splits.class_counts and "test" in splits.class_counts:
        counts["test"] = splits.class_counts["test"]
    return replace(splits, sources=sources, class_counts=counts)
