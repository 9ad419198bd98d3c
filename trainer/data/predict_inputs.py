"""Inputs for prediction, in input order: a folder or glob of image files, or fixed-length record files.

Each source yields chunks of `Item`s (one per input example, skipped ones
included) with the model-ready images of the items that could be read, so the
predictions CSV has one row per input, in order, and says which were skipped.

    python run.py mode=predict checkpoint=RUN predict.input=photos/ predict.output=predictions.csv
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from trainer.data import binary, tfrecords
from trainer.data.check import record_line, unreadable
from trainer.data.decoders import BinaryDecoder, TFRecordDecoder, attempt_each
from trainer.data.images import decode_files, list_images
from trainer.data.preprocess import Preprocess, prepare_images
from trainer.data.shares import Records
from trainer.data.sources import FixedLengthReader, Source
from trainer.errors import DataError, one_line

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One input example: its id, source file, true label (when known) and why it was skipped (if it was);
    `rest_unread`: a corrupted frame, after which the rest of its file could not be read (no item for those)."""

    id: str
    file: str
    label: int | None = None
    error: str | None = None
    rest_unread: bool = False


Chunk = tuple[list[Item], tf.Tensor | None]  # items, and images for those without an error


TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".record")
KINDS = {"images": "images", "binary": "records", "tfrecord": "tfrecords"}  # predict.format -> kind
FORMAT_ALIASES = {"records": "binary"}  # predict.format's old names, read until vggtrain 0.2: old -> today's


def is_tfrecord_name(name: str) -> bool:
    """TFRecord files by name: `*.tfrec`, `*.record`, or `tfrecord` anywhere (`train.tfrecords_003`)."""
    return "tfrecord" in name or name.endswith(TFRECORD_SUFFIXES)


def _kind(names: list[str]) -> str:
    if all(name.endswith(".bin") for name in names):
        return "records"
    if all(is_tfrecord_name(name) for name in names):
        return "tfrecords"
    if all(name.endswith((".parquet", ".arrow")) for name in names):
        return "parquet"
    return "images"


def _refuse_record_folder(spec: str, path: Path, files: list[Path]) -> None:
    """A folder of record files (the converter's output) is not a folder of images: one line on how to give it.

    Raises:
        DataError: every file of `files` but JSON ones is named as `.bin` or TFRecord records.
    """
    names = [file.name for file in files if file.suffix != ".json"]
    if not names or _kind(names) == "images" or is_tfrecord_name(path.name):
        return
    test, root = next((name for name in names if name.startswith("test")), None), spec.rstrip("/")
    if _kind(names) in ("records", "parquet"):
        pattern = f"{root}/{test or ('*.bin' if _kind(names) == 'records' else '*.parquet')}"
    else:
        pattern = f"{root}/{test.split('.')[0] if test else '*'}.tfrecord*"
    raise DataError(
        f"predict.input={spec}: a folder of record files, not of images; give the files of a split: "
        f"predict.input='{pattern}'"
    )


def resolve_inputs(spec: str, format: str = "auto") -> tuple[str, list[Path | str], Path | None]:
    """(kind, files, root) for `predict.input`: a folder of images, or a glob of `.bin`, TFRecord or image files.

    Local paths come back as `Path`s; paths on another TensorFlow file system (`gs://`, `ram://` ...)
    as strings, and only TFRecord files are read from those.

    Args:
        spec: `predict.input`.
        format: `predict.format`: `auto` tells the kind from the file names.

    Raises:
        DataError: nothing matches, or a remote input is not TFRecords.
    """
    if format in FORMAT_ALIASES:
        log.warning(
            "predict.format=%s is deprecated: it is predict.format=%s, the same fixed-length .bin records",
            format,
            FORMAT_ALIASES[format],
        )
        format = FORMAT_ALIASES[format]
    if "://" in spec:
        try:
            names = sorted(name for name in tf.io.gfile.glob(spec) if not tf.io.gfile.isdir(name))
        except tf.errors.OpError as error:
            raise DataError(f"predict.input={spec}: cannot list it ({one_line(error)})") from None
        if not names:
            raise DataError(f"predict.input={spec}: matches no file")
        kind = KINDS.get(format) or _kind(names)
        if kind != "tfrecords":
            raise DataError(
                f"predict.input={spec}: only TFRecord files are read from remote storage "
                f"(name them *.tfrecord, *.tfrec or *.record, or set predict.format=tfrecord)"
            )
        return kind, names, None
    path = Path(os.path.expanduser(spec))
    if path.is_dir() and format in ("auto", "images"):
        files = list_images(path)
        if not files:
            raise DataError(f"predict.input={spec}: the folder holds no files")
        if format == "auto":
            _refuse_record_folder(spec, path, files)
            if is_tfrecord_name(path.name):  # Spark's `NAME.tfrecords/part-r-00000`: its files are the records
                return "tfrecords", [file for file in files if not file.name.startswith(("_", "."))], None
        return "images", files, path
    pattern = str(path / "*") if path.is_dir() else os.path.expanduser(spec)
    files = sorted(Path(name) for name in glob.glob(pattern, recursive=True))
    files = [file for file in files if file.is_file()]
    if not files:
        raise DataError(f"predict.input={spec}: matches no file")
    return KINDS.get(format) or _kind([file.name for file in files]), files, None


def record_chunks(
    files: list[Path], layout: binary.BinaryLayout, preprocess: Preprocess, num_classes: int, batch_size: int
) -> Iterator[Chunk]:
    """Fixed-length records, in file order; the id is the record's index over all files. Each record travels
    with its file and number, and a record whose label is not a class of the model gets its item with the
    decoder's reason, and is not predicted."""
    counts = [binary.records_by_size(file, layout) for file in files]  # sizes checked, naming the file
    source = Source(
        Records.whole_files([str(file) for file in files], sum(counts)), FixedLengthReader(layout.record_bytes)
    )
    decoder = BinaryDecoder(layout, num_classes, classes="the model's classes")
    return checked_chunks(source, decoder, preprocess, batch_size)


def checked_chunks(source: Source, decoder, preprocess: Preprocess, batch_size: int) -> Iterator[Chunk]:
    """The records of `source` in order, decoded by `decoder.checked`: one item per record, its id its index
    over all files; a record with a reason gets it, as `FILE: record N REASON`, and is not predicted (a label
    of -1: unlabeled)."""
    batches = source.in_order().batch(batch_size)
    batches = batches.map(lambda paths, numbers, records: (paths, numbers, *decoder.checked(records)))
    index = 0
    for paths, numbers, images, labels, reasons in batches.prefetch(1):
        items = []
        for path, number, label, reason in zip(
            paths.numpy(), numbers.numpy(), labels.numpy(), reasons.numpy(), strict=True
        ):
            path = os.fsdecode(path)
            error = record_line(path, number, reason.decode()) if reason else None
            items.append(Item(str(index), Path(path).name, None if reason or label < 0 else int(label), error))
            index += 1
        good = reasons == ""
        yield items, prepare_images(tf.boolean_mask(images, good), preprocess) if bool(tf.reduce_any(good)) else None


def tfrecord_chunks(
    files: list[Path | str], spec, preprocess: Preprocess, num_classes: int, batch_size: int, resize_mode: str
) -> Iterator[Chunk]:
    """TFRecord files in the given order, one item per record; the id is the file name stored in the record,
    else its index over all files. Each record travels with its file and number through tf.data, and the
    training pipeline's own decoder (`TFRecordDecoder.checked`) gives each its reason: a record that cannot be
    used (not an Example, a label outside the model's classes, an image that does not decode, a corrupted frame)
    gets its item with the file, the record and the reason, and the rest are still predicted. Encoded images
    are made square by `resize_mode`, as training and `serve_bytes` do.

    Raises:
        DataError: every file holds no records, or a file's compression is not `dataset.compression`. A file of
            another layout (`dataset.format`, the keys, `dataset.stored_size`) gives each record its row.
    """
    kept = tfrecords.without_empty([str(file) for file in files], spec, "predict.input", tfrecords.first_labeled)
    labels = num_classes if all(kept.values()) else None  # a file without labels: no accuracy for any
    decoder = TFRecordDecoder(spec, labels, labels is not None, resize_mode, classes="the model's classes")
    index = 0
    for path in kept:
        for items, images in _file_chunks(path, spec, decoder, batch_size, index):
            index += len(items)
            yield items, prepare_images(images, preprocess) if images is not None else None


def stored_names(files: list[str], spec) -> list[str]:
    """The file name stored in each record of `files` (its index where none), in order; names that are not
    valid UTF-8 keep their bytes as backslash escapes, numbers become their digits."""
    chunks = tfrecord_chunks(files, spec, Preprocess(spec.stored_size), 0, 1024, "resize")
    return [item.id for items, _ in chunks for item in items]


def _stored_names(records: tf.Tensor, key: str) -> tf.Tensor:
    """Each record's stored file name in the graph, whatever type it is stored as (bytes, int64 or float, its
    values joined by spaces); "" for a record without one."""
    empty = lambda count: {"name": tf.fill([count], "")}  # noqa: E731
    names = empty(tf.shape(records)[0])["name"]
    for dtype in (tf.string, tf.int64, tf.float32):  # a missing key parses as no value; another type fails

        def parse(batch: tf.Tensor, dtype=dtype) -> dict:
            values = tf.RaggedTensor.from_sparse(tf.io.parse_example(batch, {key: tf.io.VarLenFeature(dtype)})[key])
            values = values if dtype == tf.string else tf.strings.as_string(values)
            return {"name": tf.strings.reduce_join(values, axis=1, separator=" ")}

        names = tf.cond(
            tf.reduce_all(names != ""),
            lambda names=names: names,
            lambda names=names, parse=parse: tf.where(
                names != "", names, attempt_each(parse, records, empty)[0]["name"]
            ),
        )
    return names


def _file_chunks(path: str, spec, decoder: TFRecordDecoder, batch_size: int, first_id: int) -> Iterator[Chunk]:
    """The items and stored-size images of one file's records, in order (see `tfrecord_chunks`); a corrupted or
    truncated frame ends the file with one item that says so (`rest_unread`)."""

    def decode(numbers: tf.Tensor, records: tf.Tensor):
        return numbers, *decoder.checked(records), _stored_names(records, spec.filename_key)

    try:
        compression = tfrecords.compression_of([path], spec.compression)
        for batch in tfrecords.numbered_batches(path, compression, batch_size, decode):
            yield _chunk(path, first_id, decoder.num_classes, *batch)
    except tfrecords.BrokenFile as broken:
        error = record_line(path, broken.number, unreadable(broken.exact))
        yield [Item(str(first_id + broken.number), _file_name(path), None, error, rest_unread=True)], None


def _chunk(path: str, first_id: int, num_classes, numbers, images, labels, reasons, names) -> Chunk:
    """Items for one batch of a file's records, and the images of those without a reason."""
    items = []
    rows = zip(numbers.numpy().tolist(), labels.numpy().tolist(), reasons.numpy(), names.numpy(), strict=True)
    for number, label, reason, name in rows:
        name = name.decode("utf-8", errors="backslashreplace") or str(first_id + number)
        error = record_line(path, number, reason.decode()) if reason else None
        known = num_classes is not None and 0 <= label < num_classes
        items.append(Item(name, _file_name(path), label if known else None, error))
    good = reasons == ""
    return items, tf.boolean_mask(images, good) if bool(tf.reduce_any(good)) else None


def _file_name(path: str) -> str:
    """A record file's name for the `file` column, as `.bin` rows give theirs (`gs://b/x.tfrecord` -> x.tfrecord)."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def _class_of(file: Path, root: Path | None, class_names: list[str]) -> int | None:
    """The class of a file in a subfolder named after it, matched case-insensitively (`Cat/` is `cat`)."""
    if root is None or file.parent == root:
        return None
    folded = [name.casefold() for name in class_names]
    top = file.relative_to(root).parts[0].casefold()
    return folded.index(top) if top in folded else None


def image_chunks(
    files: list[Path],
    root: Path | None,
    preprocess: Preprocess,
    class_names: list[str],
    batch_size: int,
    resize_mode: str = "resize",
    workers: int = 0,
) -> Iterator[Chunk]:
    """Image files in sorted order, decoded in tf.data as training decodes them (`trainer.data.decode`);
    a file that gives no image gets its item with the reason.

    Files in a subfolder named after a class (in any letter case) get that class as their label.
    """
    labels = [_class_of(file, root, class_names) for file in files]
    labeled = root is not None and all(label is not None for label in labels)
    if root is not None and not labeled and any(label is not None for label in labels):
        strays = sorted(
            {file.relative_to(root).parts[0] for file, label in zip(files, labels, strict=True) if label is None}
        )
        log.warning(
            "predict.input=%s: %s match no class of the model %s, so no image is labeled and no accuracy is given",
            root,
            ", ".join(f"{name}/" if (root / name).is_dir() else name for name in strays),
            class_names,
        )
    paths = [str(file) for file in files]
    for run in decode_files(paths, preprocess.image_size, resize_mode, batch_size, parallel=workers):
        items = []
        for index, error in enumerate(run.errors, start=run.start):
            file = files[index]
            name = str(file.relative_to(root)) if root else str(file)
            items.append(Item(name, file.name, labels[index] if labeled else None, error))
        images = prepare_images(tf.constant(run.images), preprocess) if run.images is not None else None
        yield items, images
