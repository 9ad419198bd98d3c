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
and row). A train split of one class is refused there too: a classifier needs two. Training reads the
files a batch at a time (pyarrow, in Python), and each row becomes the folder's record (the label's
`LABEL_DIGITS` digits, then the image bytes) in the graph, numbered by its row in its file
and decoded by `RowDecoder`: the one decode, which never raises but gives each row its
reason. Each worker's share is whole files or row ranges.

A null image is found at start-up, in every split the mode reads, before any training (a Parquet file's
statistics count its nulls: only a file that has some, or has no statistics, is read):
`FILE: row N: no image`. An undecodable image is named by the pipeline itself, from the
row's provenance and its reason, and each caller applies its policy (Parquet files are
records, not a photo folder): training stops, `FILE: record N cannot be decoded: REASON`
(the record is the row); `mode=predict predict.input=FILE.parquet` writes the reason in
that row's `error` column and predicts the rest; `inspect.check` counts and lists them.

    python run.py mode=predict checkpoint=RUN predict.input='beans/data/test-*.parquet' dataset=parquet
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer.data.decode import decode_checked
from trainer.data.decoders import assert_good, first_broken, label_rule
from trainer.data.folder import LABEL_DIGITS, FileDecoder
from trainer.data.parts import VAL_NAMES, Splits, val_split_name
from trainer.data.predict_inputs import checked_chunks
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import ConfigError, DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
READ_BATCH = 256  # rows pyarrow hands over at once: one Python step per batch, never per image
TO_END = 2**31 - 1  # a substring length past any record's end
SPLIT_SEED = 0  # fixes the val_fraction hold-out: the same rows in val for every run and seed
LAYOUTS = (  # where a split's files are looked for, in this order
    "{dir}/{split}.parquet, {dir}/{split}-*.parquet, {dir}/data/{split}-*.parquet, {dir}/{split}/*.parquet or "
    "{dir}/{split}/data-*.arrow"
)


def _parquet_files(folder: Path, split: str) -> list[Path]:
    """`split.parquet` and `split-*.parquet` in `folder`, sorted."""
    found = folder.glob(f"{split}*.parquet") if folder.is_dir() else []
    return sorted(path for path in found if path.name == f"{split}.parquet" or path.name.startswith(f"{split}-"))


def _image_bytes(column):
    """The encoded bytes of an image column: binary, or the `Image` feature's struct; a null is empty bytes
    (`RowDecoder` gives it its reason)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_struct(column.type):
        column = column.field("bytes")
    return pc.fill_null(column, b"").to_numpy(zero_copy_only=False)


def _null_images(column) -> np.ndarray:
    """Where an image column holds no image: a null, or a null `bytes` field of the `Image` struct."""
    import pyarrow as pa

    nulls = column.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_struct(column.type):
        nulls = nulls | column.field("bytes").is_null().to_numpy(zero_copy_only=False)
    return nulls


def _is_string_type(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _indices(labels, classes):
    """String labels -> their index in `classes` (null where a string is none of them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.index_in(labels.cast(pa.large_string()), value_set=pa.array(list(classes), pa.large_string()))


def _label_indices(labels, classes) -> np.ndarray:
    """A label column as int64 class indices: integers as they are; strings by their index in `classes`. -1
    for a null, or a string none of `classes` is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    labels = _indices(labels, classes) if classes is not None else labels.cast(pa.int64(), safe=False)
    return pc.fill_null(labels, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _is_image_type(kind) -> bool:
    import pyarrow as pa

    binary = (pa.types.is_binary, pa.types.is_large_binary)
    if pa.types.is_struct(kind):
        index = kind.get_field_index("bytes")
        return index >= 0 and any(test(kind.field(index).type) for test in binary)
    return any(test(kind) for test in binary)


def _batches(path: str, kind: str, columns: list[str], low: int, high: int) -> Iterator[tuple[int, object]]:
    """(first row, record batch) of the batches of one file that overlap rows [low, high); Parquet skips the
    row groups before them, a stream reads on to them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "arrow":
        offset = 0
        for batch in pa.ipc.open_stream(pa.memory_map(path)):
            if offset >= high:
                return
            if offset + batch.num_rows > low:
                yield offset, batch.select(columns)
            offset += batch.num_rows
        return
    parquet = pq.ParquetFile(path)
    groups, offset, first = [], 0, None
    for index in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(index).num_rows
        if offset < high and offset + rows > low:
            groups.append(index)
            first = offset if first is None else first
        offset += rows
    if not groups:
        return
    offset = first
    for batch in parquet.iter_batches(batch_size=READ_BATCH, row_groups=groups, columns=columns):
        if offset >= high:
            return
        if offset + batch.num_rows > low:
            yield offset, batch
        offset += batch.num_rows


@dataclass(frozen=True, eq=False)
class ArrowReader:
    """Reads Parquet or Arrow stream files as the folder's records (`trainer.data.sources.Reader`): a batch of
    rows at a time in Python, joined into records (label digits, then the image bytes) in the graph, each
    numbered by its row in its file.

    A range (path, start, length) counts the split's rows of that file: all of them, or those `rows` picks
    (a validation share held out of the train files)."""

    kind: str  # parquet | arrow (an IPC stream)
    columns: tuple[str, str | None]  # (image, label); no label column: every label -1 (unlabeled rows)
    rows: dict[str, np.ndarray] | None = field(default=None, repr=False)  # per file, the split's rows, sorted
    parallel: bool = True  # several files: read a few at once in training
    classes: tuple[str, ...] | None = None  # string labels: their class names, in label order (-1: none of them)

    def _rows(self, path: bytes, start: int, length: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(image bytes, labels, rows in the file) of each batch of the range."""
        path = os.fsdecode(path)
        end = start + length if length >= 0 else sys.maxsize
        picked = None if self.rows is None else self.rows[path][start : None if length < 0 else end]
        low, high = start, end
        if picked is not None:  # the rows between the first and the last picked one
            low, high = (int(picked[0]), int(picked[-1]) + 1) if len(picked) else (0, 0)
        columns = [column for column in self.columns if column]
        for offset, batch in _batches(path, self.kind, columns, low, high):
            if picked is None:  # a slice: no copy
                first = max(low - offset, 0)
                rows = np.arange(offset + first, offset + min(high - offset, batch.num_rows))
                batch = batch.slice(first, len(rows))
            else:
                rows = picked[np.searchsorted(picked, offset) : np.searchsorted(picked, offset + batch.num_rows)]
                batch = batch.take(rows - offset)
            yield _image_bytes(batch.column(self.columns[0])), self._labels(batch), rows

    def _labels(self, batch) -> np.ndarray:
        if self.columns[1] is None:
            return np.full(batch.num_rows, -1, np.int32)
        return _label_indices(batch.column(self.columns[1]), self.classes).astype(np.int32)  # null: unlabeled

    def numbered(self, path, start, length) -> tf.data.Dataset:
        """(row in the file, record) of the range's rows (`trainer.data.sources.Source` numbers by it)."""
        batches = tf.data.Dataset.from_generator(
            self._rows,
            output_signature=(
                tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int64)
            ),
            args=(path, start, length),
        )  # fmt: skip
        # The folder's record, so its decoder reads it: image and label stay one element from here on.
        records = batches.map(
            lambda images, labels, rows: (
                rows, tf.strings.join([tf.strings.as_string(labels, width=LABEL_DIGITS, fill="0"), images])
            )
        )  # fmt: skip
        return records.unbatch()

    def read(self, path, start, length):
        return self.numbered(path, start, length).map(lambda row, record: record)


@dataclass(frozen=True)
class RowDecoder(FileDecoder):
    """`ArrowReader`'s records -> (uint8 images, int32 labels, reasons): the folder's record, its image through
    the one decode (`decode_checked`, which never raises); a bad row's image is black, and its reason says why."""

    num_classes: int | None = None  # the labels' rule (predict: the model's classes, -1 unlabeled); None: checked
    # at start-up
    classes: str = ""  # where the number of classes comes from, for the reasons

    def checked(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        labels = self.labels(records)
        data = tf.strings.substr(records, LABEL_DIGITS, TO_END)
        images, refused = decode_checked(data, self.size, self.resize_mode)
        labeled = tf.where(labels == -1, 0, labels)  # -1: no label (a null, or a name no class has): predicted
        reasons = first_broken(
            label_rule(labeled, self.num_classes, self.classes),
            (tf.strings.length(data) == 0, lambda: "has no image (a null or empty bytes in the image column)"),
            (refused != "", lambda: tf.strings.join(["cannot be decoded: ", refused])),
        )
        return images, labels, reasons

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return assert_good(*self.checked(records))


def _may_hold_null_images(path: str, kind: str, column: str) -> bool:
    """Whether the image column of a file may hold a null image: a Parquet file answers from its row groups'
    statistics (no data read); a file without them, and an Arrow stream, may."""
    if kind != "parquet":
        return True
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(path).metadata
    for group in range(metadata.num_row_groups):
        leaves = [metadata.row_group(group).column(index) for index in range(metadata.num_columns)]
        leaf = next((leaf for leaf in leaves if leaf.path_in_schema in (column, f"{column}.bytes")), None)
        statistics = leaf.statistics if leaf is not None else None
        if statistics is None or not statistics.has_null_count or statistics.null_count:
            return True
    return False


def find_null_images(files: dict[str, tuple[str, np.ndarray | None]], column: str) -> None:
    """Refuses the first null image of the files {path: (kind, the rows read, None: all)} at start-up, before
    any training: a Parquet file whose statistics count no null is not read; the others' image columns are read
    for their nulls only (no pixel decoded). A bad image's bytes are named by the pipeline (`RowDecoder`).

    Raises:
        DataError: `FILE: row N: no image (a null in column 'image')`, the row counted from 0 within its file.
    """
    for path, (kind, rows) in files.items():
        if not _may_hold_null_images(path, kind, column):
            continue
        for offset, batch in _batches(path, kind, [column], 0, sys.maxsize):
            nulls = offset + np.flatnonzero(_null_images(batch.column(0))) if batch.num_rows else np.array([], int)
            nulls = nulls if rows is None else nulls[np.isin(nulls, rows)]
            if len(nulls):
                raise DataError(f"{path}: row {int(nulls[0])}: no image (a null in column {column!r})")


def _check_columns(path, schema, image: str, label: str | None) -> None:
    """Refuses a file whose schema lacks the image column or the label column (None: not read), or holds
    anything but encoded images and integer or string labels in them.

    Raises:
        DataError: one line naming the file, the column and its key.
    """
    import pyarrow as pa

    for column, key in ((image, "image_column"), (label, "label_column")):
        if column and column not in schema.names:
            raise DataError(f"{path}: no column {column!r} (dataset.{key}); its columns are {schema.names}")
    kind_of_label = schema.field(label).type if label else pa.int64()
    if not (pa.types.is_integer(kind_of_label) or _is_string_type(kind_of_label)):
        raise DataError(
            f"{path}: column {label!r} holds {kind_of_label}; expected integer or string labels (dataset.label_column)"
        )
    if not _is_image_type(schema.field(image).type):
        raise DataError(
            f"{path}: column {image!r} holds {schema.field(image).type}; expected encoded image bytes, or "
            f"the Image feature's struct with a bytes field (dataset.image_column)"
        )


def _opened(path: str, kind: str):
    """(schema, rows) of one Parquet file (from its footer) or Arrow stream (its batches counted).

    Raises:
        DataError: the file is no readable Parquet or Arrow stream file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            opened = pq.ParquetFile(path)
            return opened.schema_arrow, opened.metadata.num_rows
        stream = pa.ipc.open_stream(pa.memory_map(path))
        return stream.schema, sum(batch.num_rows for batch in stream)
    except (pa.ArrowInvalid, OSError) as error:
        what = "Parquet" if kind == "parquet" else "Arrow stream"
        raise DataError(f"{path}: not a readable {what} file ({error})") from None


def class_label_names(first: Path, kind: str, label: str) -> list[str] | None:
    """The names of the label column's `ClassLabel` feature: in `dataset_info.json` beside a `save_to_disk`
    split, else in the `huggingface` schema metadata of the `first` file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = first.parent / "dataset_info.json"
    if kind == "arrow" and info.is_file():
        features = json.loads(info.read_text()).get("features") or {}
    else:
        schema = pq.read_schema(first) if kind == "parquet" else pa.ipc.open_stream(pa.memory_map(str(first))).schema
        metadata = (schema.metadata or {}).get(b"huggingface")
        features = json.loads(metadata).get("info", {}).get("features") or {} if metadata else {}
    feature = features.get(label) if isinstance(features, dict) else None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and feature.get("names"):
        return list(feature["names"])
    return None


def file_kind(paths: list[str]) -> str:
    """`parquet` or `arrow` (an IPC stream, `*.arrow`) for files all of one kind.

    Raises:
        DataError: the files mix both.
    """
    kinds = {"arrow" if path.endswith(".arrow") else "parquet" for path in paths}
    if len(kinds) > 1:
        raise DataError(f"{paths[0]} and the others mix Parquet and Arrow stream files; give files of one kind")
    return kinds.pop()


def predict_chunks(
    files: list, columns: tuple[str, str], class_names, preprocess, num_classes: int, batch_size: int, mode: str
) -> Iterator:
    """`mode=predict` on Parquet or Arrow stream files (`trainer.data.predict_inputs.checked_chunks`): one item
    per row, in order, its id its index over all files. A row whose image does not decode, or whose label is
    not one of the model's `num_classes`, has its reason (`FILE: record ROW REASON`) and is not predicted.
    Labels are read where every file has the label column and it holds integers, or strings that
    `class_names` (`dataset.class_names`) names; else the rows are unlabeled, and so is a row whose label is
    null or a name none of `class_names` is (predicted, its true class left empty).

    Raises:
        DataError: a file is unreadable, or lacks the image column.
    """
    paths = [str(file) for file in files]
    kind, image, label = file_kind(paths), *columns
    opened = [_opened(path, kind) for path in paths]
    labeled = all(label in schema.names for schema, _ in opened)
    for path, (schema, _) in zip(paths, opened, strict=True):
        _check_columns(path, schema, image, label if labeled else None)
    strings = labeled and _is_string_type(opened[0][0].field(label).type)
    labeled = labeled and (not strings or bool(class_names))
    reader = ArrowReader(
        kind, (image, label if labeled else None), classes=tuple(class_names) if labeled and strings else None
    )
    source = Source(Records.whole_files(paths, sum(rows for _, rows in opened)), reader)
    decoder = RowDecoder(preprocess.image_size, mode, num_classes if labeled else None, "the model's classes")
    return checked_chunks(source, decoder, preprocess, batch_size)


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
            _check_columns(path, schema, *self.columns)
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
        strings = [_is_string_type(column.type) for _, column in files]
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
            part.labels = [_label_indices(column, names) for column in part.columns]
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
        if len(names) < 2:
            raise DataError(f"dataset.data_dir={self.root}: one class ({names[0]}); a classifier needs two")
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
        present = np.unique(trained)
        if len(present) == 1:
            splits = "train and val splits (dataset.folds) hold" if self.folds else "train split holds"
            raise DataError(
                f"dataset.data_dir={self.root}: the {splits} one class ({names[present[0]]}); a classifier needs two"
            )

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
