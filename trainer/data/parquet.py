"""`dataset=parquet`: reads Parquet files or a `save_to_disk` folder (keys: `trainer.data.formats.parquet`).

    python run.py dataset=parquet dataset.data_dir=beans/                          # beans/data/train-*.parquet ...
    python run.py dataset=parquet dataset.data_dir=cifar10/ dataset.val_fraction=0.1  # train and test only
    python run.py dataset=parquet dataset.data_dir=saved/ dataset.image_column=img   # saved/train/data-*.arrow

`dataset.data_dir` holds, per split, either Parquet files named after it (`train.parquet`,
`train-00000-of-00002.parquet`, also in a `data/` subfolder: the Hub's layout, or any in
`DIR/train/`), or the Arrow stream files of `datasets`' `save_to_disk` (`DIR/train/data-*.arrow`). The image
column holds encoded bytes, or the `Image` feature's `{bytes, path}` struct; the label
column holds integers, named by the `ClassLabel` feature when the files carry one, or strings
(pandas and polars write `large_string`): each is its class's name, indexed by
`dataset.class_names` when given, else the classes are the train split's distinct strings, sorted.

The label column of every file is read once at start-up: the counts, the classes, without a validation
split the per-class hold-out of `dataset.val_fraction`, and in the splits the mode reads (`mode=evaluate`
of the test split reads no train file) a null label or one outside the classes (one line naming the file
and row). A train split of one class is refused there too: a classifier needs two. The files themselves are
read, checked and decoded row by row by `trainer.data.parquet_rows`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.data.parquet_rows import (
    ArrowReader,
    RowDecoder,
    check_columns,
    class_label_names,
    find_null_images,
    is_string_type,
    label_indices,
)
from trainer.data.parts import VAL_NAMES, Splits, two_classes, val_split_name
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import ConfigError, DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
SPLIT_SEED = 0  # fixes the val_fraction hold-out: the same rows in val for every run and seed
LAYOUTS = (  # where a split's files are looked for, in this order
    "{dir}/{split}.parquet, {dir}/{split}-*.parquet, {dir}/data/{split}-*.parquet, {dir}/{split}/*.parquet or "
    "{dir}/{split}/data-*.arrow"
)


def _parquet_files(folder: Path, split: str) -> list[Path]:
    """`split.parquet` and `split-*.parquet` in `folder`, sorted."""
    found = folder.glob(f"{split}*.parquet") if folder.is_dir() else []
    return sorted(path for path in found if path.name == f"{split}.parquet" or path.name.startswith(f"{split}-"))


def _class_counts(labels: np.ndarray, names: list[str]) -> dict[str, int]:
    """{class name: its rows}; a bad label (in a split the mode does not read) is not counted."""
    counts = np.bincount(labels[(labels >= 0) & (labels < len(names))], minlength=len(names))
    return dict(zip(names, counts.tolist(), strict=True))


def _rows_read(splits: list[_Split]) -> dict[str, tuple[str, np.ndarray | None]]:
    """{path: (kind, the rows `splits` read of it; None: every row)}, each file once, in order."""
    files: dict[str, tuple[str, np.ndarray | None]] = {}
    for part in splits:
        for path in part.files:
            rows = None if part.rows is None else part.rows[str(path)]
            known = files.get(str(path), (part.kind, np.array([], np.int64)))[1]
            files[str(path)] = (part.kind, None if rows is None or known is None else np.union1d(known, rows))
    return files


@dataclass
class _Split:
    """One split's files, their layout and each file's labels."""

    kind: str
    files: list[Path]
    columns: list = field(default_factory=list)  # each file's label column as read (pyarrow), for the reasons
    labels: list[np.ndarray] = field(default_factory=list)  # each file's class indices; -1: null, unknown name
    rows: dict[str, np.ndarray] | None = None  # a share of the files' rows (val_fraction); None: every row

    @property
    def counts(self) -> list[int]:
        if self.rows is None:
            return [len(labels) for labels in self.labels]
        return [len(self.rows[str(path)]) for path in self.files]

    def rows_of(self, path: Path) -> np.ndarray | slice:
        """The split's rows of one of its files."""
        return slice(None) if self.rows is None else self.rows[str(path)]

    def all_labels(self) -> np.ndarray:
        return np.concatenate(
            [labels[self.rows_of(path)] for path, labels in zip(self.files, self.labels, strict=True)]
        )


class ArrowLoader:
    """Reads the Parquet or Arrow files `keys` (`trainer.data.formats.parquet.ArrowFiles`) names."""

    def __init__(self, keys) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError(
                f'dataset={keys.name} reads Parquet and Arrow files with pyarrow: pip install -e ".[parquet]"'
            ) from None
        self.root, self.size, self.name = Path(os.path.expanduser(str(keys.data_dir))), keys.image_size, keys.name
        self.columns = (keys.image_column, keys.label_column)
        self.split_names = dict(zip(SPLITS, (keys.train_split, keys.val_split, keys.test_split), strict=True))
        self.class_names = list(keys.class_names) if keys.class_names else None
        self.val_fraction, self.resize_mode = keys.val_fraction, str(keys.resize_mode)
        self.folds = keys.folds  # cross-validation trains on train and val
        self.string_classes: list[str] | None = None  # string labels: the classes they name (set by load)

    # --- which files -------------------------------------------------------------------------------------------

    def _find(self, name: str) -> _Split | None:
        """The files of the split named `name` in the first layout that has any."""
        for found in (_parquet_files(self.root, name), _parquet_files(self.root / "data", name)):
            if found:
                return _Split("parquet", found)
        folder = self.root / name
        for kind, pattern in (("parquet", "*.parquet"), ("arrow", "data-*.arrow")):
            if found := sorted(folder.glob(pattern)) if folder.is_dir() else []:
                return _Split(kind, found)
        return None

    def _labels(self, path: Path, kind: str):
        """The label column of one file (pyarrow), after checking that both columns are there and what they hold;
        its rows are checked only where a mode reads them (`_check_labels`)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        label = self.columns[1]
        try:
            opened = pq.ParquetFile(path) if kind == "parquet" else pa.ipc.open_stream(pa.memory_map(str(path)))
            schema = opened.schema_arrow if kind == "parquet" else opened.schema
            check_columns(path, schema, *self.columns)
            if kind == "parquet":
                labels = opened.read(columns=[label]).column(0)
            else:  # a stream has no index: its batches are read once, for their labels
                labels = pa.chunked_array([batch.column(label) for batch in opened], schema.field(label).type)
        except (pa.ArrowInvalid, OSError) as error:
            what = "Parquet" if kind == "parquet" else "Arrow stream"
            raise DataError(f"{path}: not a readable {what} file ({error})") from None
        return labels.combine_chunks()

    def _string_classes(self, splits: dict[str, _Split]) -> list[str] | None:
        """Sets each split's class indices (`_Split.labels`) and returns the class names of string labels:
        `dataset.class_names` when given, else the train split's distinct strings, sorted. None where the
        labels are integers.

        Raises:
            DataError: files that mix integer and string labels.
        """
        import pyarrow.compute as pc

        files = [pair for part in splits.values() for pair in zip(part.files, part.columns, strict=True)]
        strings = [is_string_type(column.type) for _, column in files]
        if any(strings) and not all(strings):
            path = files[strings.index(not strings[0])][0]
            raise DataError(
                f"{path}: column {self.columns[1]!r} holds {'strings' if not strings[0] else 'integers'}, "
                f"where {files[0][0]} holds {'strings' if strings[0] else 'integers'}; expected one kind of label"
            )
        names = None
        if all(strings):
            found = {value for column in splits["train"].columns for value in pc.unique(column).to_pylist()}
            names = self.class_names or sorted(found - {None})
        for part in splits.values():
            part.labels = [label_indices(column, names) for column in part.columns]
        return names

    def _names(self, train: _Split, labels: dict[str, np.ndarray], strings: list[str] | None) -> list[str]:
        found = None if strings else class_label_names(train.files[0], train.kind, self.columns[1])
        if found and self.class_names and self.class_names != found:
            log.warning(
                "dataset.class_names=%s differ from the ClassLabel names %s of %s: the data's names win",
                self.class_names,
                found,
                train.files[0],
            )
        largest = max((int(v.max()) for v in labels.values() if len(v)), default=-1)  # -1: a null
        names = found or strings or self.class_names or [str(i) for i in range(largest + 1)]
        if not names:
            raise DataError(
                f"dataset.data_dir={self.root}: no row has a label of 0 or more (column {self.columns[1]!r})"
            )
        two_classes(names, lambda one: f"dataset.data_dir={self.root}: one class ({one})")
        return names

    def _check_labels(self, split: _Split, names: list[str]) -> None:
        """Refuses the first of the split's rows (in file order) whose label is null or none of the classes.

        Raises:
            DataError: `FILE: row N has no label ...`, `... has label 'NAME' ..., none of the classes ...` or
                `... has label L, outside the K classes ...`.
        """
        label = self.columns[1]
        for path, column, labels in zip(split.files, split.columns, split.labels, strict=True):
            rows = np.arange(len(labels))[split.rows_of(path)]
            bad = rows[(labels[rows] < 0) | (labels[rows] >= len(names))]
            if not len(bad):
                continue
            row = int(bad[0])
            value = column[row].as_py()
            if value is None:
                raise DataError(f"{path}: row {row} has no label (column {label!r})")
            if isinstance(value, str):
                given = "dataset.class_names" if self.class_names else "the train split's labels"
                shown = names if len(names) <= 10 else names[:10] + ["..."]
                raise DataError(
                    f"{path}: row {row} has label {value!r} (column {label!r}), none of the classes of {given} {shown}"
                )
            raise DataError(
                f"{path}: row {row} has label {value}, outside the {len(names)} classes "
                f"(0-{len(names) - 1}: {names[:5]}{' ...' if len(names) > 5 else ''}) of column {label!r}"
            )

    def _check_trained_classes(self, labels: dict[str, np.ndarray], names: list[str]) -> None:
        """Refuses training on one class, as the other formats do at start-up (the report at the end found it
        only after the first step, and named the test split); `dataset.folds` trains on train and val.

        Raises:
            DataError: `dataset.data_dir=DIR: the train split holds one class (NAME); a classifier needs two`.
        """
        trained = np.concatenate([labels["train"], labels["val"]]) if self.folds else labels["train"]
        splits = "train and val splits (dataset.folds) hold" if self.folds else "train split holds"
        present = [names[label] for label in np.unique(trained)]
        if present:  # none: the split's own check names it
            two_classes(present, lambda one: f"dataset.data_dir={self.root}: the {splits} one class ({one})")

    def _warn_untrained(self, train: np.ndarray, names: list[str]) -> None:
        """One warning naming the classes with no training row: the model learns them from no example. Integer
        labels without names make their classes 0 to the largest label, so labels 0, 1, 2 and 7 are 8 classes.
        A warning, not a refusal (the folder format's, whose empty class folder is a mistake): integer labels are
        often indices into a larger set of classes (a subset of ImageNet), kept so that outputs match them."""
        missing = np.flatnonzero(np.bincount(train, minlength=len(names)) == 0)
        if not len(missing):
            return
        inferred = not (self.string_classes or self.class_names) and names == [str(i) for i in range(len(names))]
        shown = ", ".join(names[i] if inferred else repr(names[i]) for i in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        origin = (
            f"the classes are 0 to {len(names) - 1}, the largest label, as column {self.columns[1]!r} has no "
            f"ClassLabel names and dataset.class_names is unset"
            if inferred
            else f"{len(names)} classes"
        )
        log.warning(
            "dataset.data_dir=%s: %s %s%s %s no row in the train split (%s): the model learns %s from no example",
            self.root, "labels" if inferred else "classes", shown, more, "have" if len(missing) > 1 else "has",
            origin, "them" if len(missing) > 1 else "it",
        )  # fmt: skip

    def _hold_out(self, train: _Split) -> _Split:
        """Moves `val_fraction` of each class of `train`'s rows to the returned val split, seeded by `SPLIT_SEED`
        (not the training seed: every run trains on the same rows)."""
        labels = np.concatenate(train.labels)
        order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
        order = order[np.argsort(labels[order], kind="stable")]  # by class, shuffled within each class
        _, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
        place = np.arange(len(order)) - np.repeat(starts, counts)  # a row's place in its class
        held = np.zeros(len(labels), bool)
        held[order] = place < np.repeat(np.round(counts * self.val_fraction), counts)
        if not held.any():
            raise DataError(
                f"dataset.val_fraction={self.val_fraction} holds out no row of the {len(labels)} train rows"
            )
        ends = np.cumsum([len(part) for part in train.labels])
        val = _Split(train.kind, train.files, train.columns, train.labels, {})
        train.rows = {}
        for path, end, part in zip(train.files, ends, train.labels, strict=True):
            mask = held[end - len(part) : end]
            train.rows[str(path)], val.rows[str(path)] = np.flatnonzero(~mask), np.flatnonzero(mask)
        return val

    def _listing(self, check_val: bool) -> dict[str, _Split]:
        if not self.root.is_dir():
            raise DataError(f"dataset.data_dir={self.root}: no such folder")
        names = dict(self.split_names)
        candidates = dict.fromkeys([names["val"], *VAL_NAMES])
        names["val"] = val_split_name([name for name in candidates if self._find(name)], str(self.root), names["val"])
        splits = {split: found for split in SPLITS if names[split] and (found := self._find(names[split]))}
        if "train" not in splits:
            layouts = LAYOUTS.format(dir=self.root, split=self.split_names["train"])
            raise DataError(
                f"dataset.data_dir={self.root}: no file of the train split "
                f"(dataset.train_split={self.split_names['train']}); expected {layouts}"
            )
        for part in splits.values():
            part.columns = [self._labels(path, part.kind) for path in part.files]
        self.string_classes = self._string_classes(splits)
        if not sum(len(labels) for labels in splits["train"].labels):
            raise DataError(f"dataset.data_dir={self.root}: the files of the train split hold no rows")
        if "val" not in splits:
            if self.val_fraction:
                splits["val"] = self._hold_out(splits["train"])
            elif check_val:
                raise DataError(
                    f"dataset.data_dir={self.root}: no {self.split_names['val']} split (dataset.val_split; val, "
                    f"validation and valid are found alike); found {[names[split] for split in splits]}: set "
                    f"dataset.val_split, or dataset.val_fraction "
                    f"to hold out a share of {self.split_names['train']}"
                )
            else:  # never read
                splits["val"] = splits.get("test", splits["train"])
        if "test" not in splits:
            log.warning(
                "dataset.data_dir=%s has no %s split: the test split is the validation split <dataset.test_split>",
                self.root,
                self.split_names["test"],
            )
            splits["test"] = splits["val"]
        return splits

    # --- the part ----------------------------------------------------------------------------------------------

    def load(self, check_val: bool = True, reads: tuple[str, ...] = SPLITS) -> Splits:
        """The splits; only those in `reads` (the caller reads no other) have their labels and images checked,
        and only a run that reads train has its classes checked."""
        splits = self._listing(check_val)
        labels = {split: part.all_labels() for split, part in splits.items()}
        names = self._names(splits["train"], labels, self.string_classes)
        read = list({id(splits[split]): splits[split] for split in reads}.values())  # test may be val, val train
        for part in read:
            self._check_labels(part, names)
        if "train" in reads:
            self._check_trained_classes(labels, names)
            self._warn_untrained(labels["train"], names)
        log.info(
            "Dataset %s from %s (%s files): %s images of %d classes %s <dataset=%s>",
            self.name,
            self.root,
            splits["train"].kind,
            {split: len(values) for split, values in labels.items()},
            len(names),
            names if len(names) <= 20 else names[:20] + ["..."],
            self.name,
        )
        sources = {}
        for split, part in splits.items():
            files = [str(path) for path in part.files]
            classes = tuple(names) if self.string_classes else None
            reader = ArrowReader(part.kind, self.columns, part.rows, classes=classes)
            sources[split] = Source(Records.whole_files(files, sum(part.counts)), reader)
        train, decoder = splits["train"], RowDecoder(self.size, self.resize_mode)
        find_null_images(_rows_read(read), self.columns[0])  # before training, not after it
        return Splits(
            sources,
            decoder,
            names,
            lambda: ([str(path) for path in train.files], train.counts),
            {split: _class_counts(values, names) for split, values in labels.items()},
            resize_mode=self.resize_mode,
            photos=True,
        )
