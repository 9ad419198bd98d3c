"""Parquet and Arrow stream files, row by row (`dataset=parquet`'s loader is `trainer.data.parquet`): the reader,
the one decode of a row, and the checks of the files themselves (columns, null images, `ClassLabel` names); also
`mode=predict` on such files.

    python run.py mode=predict checkpoint=RUN predict.input='beans/data/test-*.parquet' dataset=parquet

Training reads the files a batch at a time (pyarrow, in Python), and each row becomes the folder's record
(the label's `LABEL_DIGITS` digits, then the image bytes) in the graph, numbered by its row in its file
and decoded by `RowDecoder`: the one decode, which never raises but gives each row its
reason. Each worker's share is whole files or row ranges.

A null image is found at start-up, in every split the mode reads, before any training (a Parquet file's
statistics count its nulls: only a file that has some, or has no statistics, is read):
`FILE: row N: no image`. An undecodable image is named by the pipeline itself, from the
row's provenance and its reason, and each caller applies its policy (Parquet files are
records, not a photo folder): training stops, `FILE: record N cannot be decoded: REASON`
(the record is the row); `mode=predict predict.input=FILE.parquet` writes the reason in
that row's `error` column and predicts the rest; `inspect.check` counts and lists them.
"""

from __future__ import annotations

import json
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
from trainer.data.predict_inputs import checked_chunks
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import DataError

READ_BATCH = 256  # rows pyarrow hands over at once: one Python step per batch, never per image
TO_END = 2**31 - 1  # a substring length past any record's end


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


def is_string_type(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _indices(labels, classes):
    """String labels -> their index in `classes` (null where a string is none of them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.index_in(labels.cast(pa.large_string()), value_set=pa.array(list(classes), pa.large_string()))


def label_indices(labels, classes) -> np.ndarray:
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
        return label_indices(batch.column(self.columns[1]), self.classes).astype(np.int32)  # null: unlabeled

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


def check_columns(path, schema, image: str, label: str | None) -> None:
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
    if not (pa.types.is_integer(kind_of_label) or is_string_type(kind_of_label)):
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
        check_columns(path, schema, image, label if labeled else None)
    strings = labeled and is_string_type(opened[0][0].field(label).type)
    labeled = labeled and (not strings or bool(class_names))
    reader = ArrowReader(
        kind, (image, label if labeled else None), classes=tuple(class_names) if labeled and strings else None
    )
    source = Source(Records.whole_files(paths, sum(rows for _, rows in opened)), reader)
    decoder = RowDecoder(preprocess.image_size, mode, num_classes if labeled else None, "the model's classes")
    return checked_chunks(source, decoder, preprocess, batch_size)
