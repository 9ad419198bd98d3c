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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer.data import binary, pipeline, record_rows, tfrecords
from trainer.data.decoders import BinaryDecoder, TFRecordDecoder
from trainer.data.images import decode_files, list_images
from trainer.data.preprocess import Preprocess, prepare_images
from trainer.data.shares import Records
from trainer.data.sources import FixedLengthReader, Source
from trainer.data.tfrecords import compression_of
from trainer.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One input example: its id, source file, true label (when known) and why it was skipped (if it was)."""

    id: str
    file: str
    label: int | None = None
    error: str | None = None


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
    if _kind(names) == "records":
        pattern = f"{root}/{test or '*.bin'}"
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
            raise DataError(f"predict.input={spec}: cannot list it ({tfrecords.first_line(error)})") from None
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
    """Fixed-length records, in file order; the id is the record's index over all files. A record whose
    label is not a class of the model gets its item with the reason, and is not predicted."""
    owners, labels = [], []
    for file in files:  # sizes checked, naming the file
        stored = binary.stored_labels(file, layout)
        owners += [(file, number) for number in range(len(stored))]
        labels += stored.tolist()
    source = Source(
        Records.whole_files([str(file) for file in files], len(owners)), FixedLengthReader(layout.record_bytes)
    )
    index = 0
    for images, _ in pipeline.eval_dataset(source, BinaryDecoder(layout), preprocess, batch_size):
        items = [
            _binary_item(index + offset, *owners[index + offset], labels[index + offset], num_classes)
            for offset in range(len(images))
        ]
        index += len(items)
        kept = [item.error is None for item in items]
        yield items, (images if all(kept) else tf.boolean_mask(images, kept)) if any(kept) else None


def _binary_item(index: int, file: Path, number: int, label: int, num_classes: int) -> Item:
    if label < num_classes:
        return Item(str(index), file.name, label)
    reason = f"{file}: record {number} has label {label}, expected 0 to {num_classes - 1} (the model's classes)"
    return Item(str(index), file.name, None, reason)


def tfrecord_chunks(
    files: list[Path | str], spec, preprocess: Preprocess, num_classes: int, batch_size: int
) -> Iterator[Chunk]:
    """TFRecord files in the given order, one item per record; the id is the file name stored in the record,
    else its index over all files. A record that cannot be used (not an Example, a label outside the model's
    classes, an image that does not decode, a corrupted frame) gets its item with the file, the record and
    the reason, and the rest are still predicted.

    Every record is parsed, checked and decoded in tf.data by the training pipeline's own decoder (its checks
    are the rules of a valid record); one it refuses is dropped there, and only a file that had one is read
    again in Python (`trainer.data.record_rows`) for the reasons.

    Raises:
        DataError: every file holds no records, or a file's compression is not `dataset.compression`. A file of
            another layout (`dataset.format`, the keys, `dataset.stored_size`) gives each record its row.
    """
    # Every record by one rule: record 0 that is no Example, or has no image, gets its row as record 7 does.
    kept = tfrecords.without_empty([str(file) for file in files], spec, "predict.input", tfrecords.first_labeled)
    labels = num_classes if all(kept.values()) else None  # a file without labels: no accuracy for any
    index = 0
    for path in kept:
        for items, images in _file_chunks(path, spec, labels, batch_size, index):
            index += len(items)
            yield items, prepare_images(images, preprocess) if images is not None else None


def _name_parser(path: str, spec) -> Callable[[tf.Tensor], tf.Tensor]:
    """Reads a record's stored file name in the graph, as the type the file's first record stores it (bytes,
    int64 or float; a record storing another type is refused, and named, by the Python reading)."""
    example = tfrecords.first_example(path, spec)
    feature = example.features.feature.get(spec.filename_key) if example is not None else None
    kind = feature.WhichOneof("kind") if feature is not None else None
    if kind is None:
        return lambda record: tf.constant(b"")
    dtype = {"bytes_list": tf.string, "int64_list": tf.int64, "float_list": tf.float32}[kind]

    def name(record: tf.Tensor) -> tf.Tensor:
        values = tf.io.parse_single_example(record, {spec.filename_key: tf.io.VarLenFeature(dtype)})
        values = values[spec.filename_key].values
        return tf.strings.reduce_join(values if dtype == tf.string else tf.strings.as_string(values), separator=" ")

    return name


def _file_chunks(path: str, spec, num_classes: int | None, batch_size: int, first_id: int) -> Iterator[Chunk]:
    """The items and stored-size images of one file's records, in order (see `tfrecord_chunks`)."""
    decoder = TFRecordDecoder(spec, num_classes, labeled=num_classes is not None)
    name_of = _name_parser(path, spec)

    def one(number: tf.Tensor, record: tf.Tensor):
        images, labels = decoder(record[tf.newaxis])
        return number, images[0], labels[0], name_of(record)

    records = tf.data.TFRecordDataset(path, compression_type=compression_of([path], spec.compression)).enumerate()
    decoded = records.map(one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).ignore_errors()
    checked: dict[int, record_rows.CheckedRecord] | None = None  # read in Python once a record is missing
    expected = 0
    for numbers, images, labels, names in decoded.batch(batch_size).prefetch(1).with_options(_ordered()):
        numbers = numbers.numpy().tolist()
        if numbers[-1] - expected + 1 > len(numbers):  # some records of this run were refused
            checked = checked or _checked_in_python(path, spec, num_classes)
        good = zip(images.numpy(), labels.numpy().tolist(), names.numpy().tolist(), strict=True)
        found = {number: (image, label, name.decode("utf-8", errors="backslashreplace"))
                 for number, (image, label, name) in zip(numbers, good, strict=True)}  # fmt: skip
        yield _chunk(range(expected, numbers[-1] + 1), found, checked, path, first_id, num_classes)
        expected = numbers[-1] + 1
    if _readable_records(path, spec) != expected:  # refused records at the end, or a broken frame
        checked = checked or _checked_in_python(path, spec, num_classes)
        yield _chunk([number for number in sorted(checked) if number >= expected], {}, checked, path, first_id, None)


def _file_name(path: str) -> str:
    """A record file's name for the `file` column, as `.bin` rows give theirs (`gs://b/x.tfrecord` -> x.tfrecord)."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def _chunk(numbers, found: dict, checked: dict | None, path: str, first_id: int, num_classes: int | None) -> Chunk:
    """Items for the records `numbers` of one file: those the pipeline decoded (`found`), else what the Python
    reading says (a record the graph could not express, such as a file name of another type, is still used)."""
    items, images = [], []
    for number in numbers:
        if number in found:
            image, label, name = found[number]
            items.append(Item(name or str(first_id + number), _file_name(path), label if num_classes else None))
            images.append(image)
            continue
        record = checked[number]
        error = f"{path}: record {record.number} {record.error}" if record.error else None
        items.append(Item(record.name or str(first_id + number), _file_name(path), record.label, error))
        if error is None:
            images.append(record.image)
    return items, tf.constant(np.stack(images)) if images else None


def _ordered() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False  # as in trainer.data.pipeline: no model thread to wait for at the end
    return options


def _checked_in_python(path: str, spec, num_classes: int | None) -> dict[int, record_rows.CheckedRecord]:
    """Every record of one file read and checked in Python, by number, each usable one with its image (a record
    that passes these checks but not the decoder gets the decoder's reason)."""
    decoder = TFRecordDecoder(spec, labeled=False)
    checked = {}
    for records in record_rows.read_checked(path, spec, num_classes, 256):
        for record in records:
            if record.error is None:
                images, refused = tfrecords.decode_each([record.serialized], decoder)
                record.error = f"cannot be decoded: {refused[0]}" if refused[0] else None
                record.image = None if refused[0] else images[0].numpy()
            checked[record.number] = record
    return checked


def _readable_records(path: str, spec) -> int | None:
    """The records of a file, counted in C++ without parsing them; None when a frame is broken."""
    count = 0
    try:
        for batch in tf.data.TFRecordDataset(path, compression_type=compression_of([path], spec.compression)).batch(
            4096
        ):
            count += int(batch.shape[0])
    except tf.errors.OpError:
        return None
    return count


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
