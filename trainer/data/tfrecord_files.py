"""`dataset=cats_dogs`: reads TFRecord shards (the converter's, or the classic files); the keys are in
`trainer.data.formats.tfrecord`.

    python -m trainer.convert PetImages/ records/ --image-size 64 --format jpeg
    python run.py dataset=cats_dogs dataset.data_dir=records/      # 64-pixel JPEG records, from the manifest

A converted folder is read as its `manifest.json` says: the stored size, the format, the
resize mode, the decode and the classes. A config value that contradicts the manifest is one
line naming both; one left unset (null) takes the manifest's, else the classic raw 224 layout
of two classes, cat and dog.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from trainer.data import tfrecords
from trainer.data.check import describe, record_entry, unreadable
from trainer.data.decode import check_decode
from trainer.data.decoders import TFRecordDecoder
from trainer.data.parts import Splits
from trainer.data.predict_inputs import tfrecord_chunks
from trainer.data.shares import Records
from trainer.data.sources import Source, TFRecordReader
from trainer.errors import DataError

log = logging.getLogger(__name__)

CLASSIC = {"format": "raw", "stored_size": 224, "resize_mode": "resize"}  # files without a manifest
CLASSIC_CLASSES = ["cat", "dog"]  # the classic files' labels, without a manifest or dataset.class_names


def _manifest_entry(manifest: dict | None, split: str, files: list[str]) -> dict | None:
    """The converter's manifest entry of a split, when it lists exactly these files."""
    entry = (manifest or {}).get("splits", {}).get(split)
    if entry and sorted(entry["files"]) == sorted(file.rsplit("/", 1)[-1] for file in files):
        return entry
    return None


def _count(files: list[str], manifest: dict | None, split: str, spec, num_classes: int, listed: list | None) -> int:
    """Records in a split: from the converter's manifest when it lists exactly these files, else counted
    (every checksum and label checked on the way).

    Args:
        listed: None: refuse a bad record. A list: the data check's load, which lists every bad record as it
            reads them: labels are left to it, a corrupted frame ends its file's count, and one its read will not
            meet (a frame cut inside its header: `tfrecords.BrokenFile.quiet`) is added to `listed`.

    Raises:
        DataError: a record refused (its one line), or a corrupted frame, unless `listed` is a list.
    """
    entry = _manifest_entry(manifest, split, files)
    if entry:
        return int(entry["count"])
    count = 0
    for file in files:
        try:
            count += tfrecords.scan_records(file, spec, num_classes if listed is None else None)
        except tfrecords.BrokenFile as error:
            if listed is None:
                raise
            count += error.number
            if error.quiet:
                listed.append(record_entry(file, error.number, unreadable(error.exact)))
                log.warning("Bad record %s", describe(listed[-1]))
    return count


def _file_counts(files: list[str], manifest: dict | None, spec) -> list[int]:
    """Records per train file: the manifest's `file_counts` for exactly these files, else counted."""
    entry = _manifest_entry(manifest, "train", files) or {}
    listed = dict(zip(entry.get("files", []), entry.get("file_counts", []), strict=False))
    if len(listed) == len(entry.get("files", [])) and listed:
        return [int(listed[file.rsplit("/", 1)[-1]]) for file in files]
    log.info("Counting the records of %d train file(s) for the worker shares <strategy=multi_worker>", len(files))
    return [tfrecords.scan_records(file, spec) for file in files]


def broken_frame_finder(
    files: dict[str, list[str]],
    spec: tfrecords.RecordSpec,
    counted: tuple[str, dict[str, int]] | None = None,
    shards: tuple[str, dict[str, int]] | None = None,
):
    """`Splits.find_bad_record` of TFRecord files: a bad record is named by the pipeline itself (its provenance and
    the decoder's reason); only a corrupted frame, which holds no record to carry, is found by reading the frames
    again (with a manifest, no file was read whole at start-up). Its errors: a data-loss error, or a split that
    held another number of records than counted (`tf.errors.FailedPreconditionError`), as TensorFlow ends its read
    quietly at a frame cut inside its header. `counted`: (the file that gave them, the record counts of the splits
    it gave): a split read whole that holds another number is named with it (a manifest older than its files).
    `shards`: (the file that lists them, the records of each file), for a listing per file (TFDS's
    `dataset_info.json`, whose splits may be ranges of files): a file that holds another number is named."""
    paths = list(dict.fromkeys(path for split in files.values() for path in split))

    def find(error: Exception) -> None:
        if not isinstance(error, tf.errors.DataLossError | tf.errors.FailedPreconditionError):
            return
        log.warning(
            "A corrupted frame or a miscount stopped the input pipeline; reading the %d record files", len(paths)
        )
        held = {}
        for path in paths:  # raises BrokenFile, naming the file and record
            compression = tfrecords.compression_of([path], spec.compression)
            batches = tfrecords.numbered_batches(path, compression, tfrecords.SCAN_BATCH, lambda numbers, _: numbers)
            held[path] = sum(int(tf.size(numbers)) for numbers in batches)
        listing, listed = shards or (None, {})
        for path, count in listed.items():
            if held.get(path, count) != count:
                raise DataError(
                    f"{path}: holds {held[path]} records, but {listing} lists {count} for it: the files changed "
                    "after it was written; prepare the dataset again"
                )
        source, counts = counted or (None, {})
        for split, count in counts.items():
            found = sum(held[path] for path in files[split])
            if found != count:
                raise DataError(
                    f"{source}: counts {count} records in the {split} split, but its {len(files[split])} file(s) hold "
                    f"{found}: they changed after it was written; convert them again"
                )

    return find


def _broken_first_kept(path: str, spec: tfrecords.RecordSpec) -> bool | None:
    """`tfrecords.inspect_first`, but a broken first frame (as labeled: nothing of it can be read) or a first
    record the decoder refuses keeps its file, so the data check lists it as a bad record and goes on."""
    try:
        return tfrecords.inspect_first(path, spec)
    except tfrecords.BrokenFile:
        return True
    except tfrecords.RefusedFirst:
        return True  # as labeled: the check lists the refused record, and any of its records without a label


def layout_of(manifest_file: str | None, manifest: dict | None, **config) -> dict:
    """The format, stored size and resize mode to read with: the config's where set (not None), else the
    manifest's, else the classic layout.

    Raises:
        DataError: a set config value contradicts the manifest, or the manifest's images were decoded
            another way than this version decodes (`trainer.data.decode.DECODE`).
    """
    written = (
        {}
        if manifest is None
        else {
            "format": manifest.get("format"),
            "stored_size": manifest.get("image_size"),
            "resize_mode": manifest.get("resize"),
        }
    )
    chosen = {}
    for key, value in config.items():
        recorded = written.get(key)
        if value is not None and recorded is not None and value != recorded:
            raise DataError(
                f"dataset.{key}={value} contradicts {manifest_file}, which says the records were written with "
                f"{key}={recorded}; leave dataset.{key} unset (null) to read them as written"
            )
        chosen[key] = value if value is not None else recorded if recorded is not None else CLASSIC[key]
    if manifest is not None and not manifest.get("decode"):
        log.warning(
            "%s was written by an older converter (Pillow's decode and bicubic resize): serving and mode=predict "
            "decode photos slightly differently; convert again for identical pixels",
            manifest_file,
        )
    check_decode((manifest or {}).get("decode"), str(manifest_file))
    return chosen


class TFRecordLoader:
    """Reads the shards `keys` (`trainer.data.formats.tfrecord.TFRecordFiles`) names, as its manifest says."""

    def __init__(self, keys) -> None:
        self.patterns = {"train": keys.train_files, "val": keys.val_files, "test": keys.test_files}
        self.num_classes, self.class_names, self.name = keys.num_classes, keys.class_names, keys.name
        # each None (unset) or its plain value: a choice as its string
        self.config = {key: str(v) if isinstance(v, str) else v for key in CLASSIC for v in [getattr(keys, key)]}
        self.keys = {"image": keys.image_key, "label": keys.label_key, "filename": keys.filename_key}
        self.compression = str(keys.compression)

    def spec(self, files: list[str]) -> tuple[tfrecords.RecordSpec, dict | None, str]:
        """(the record spec, the manifest, the resize mode) for files of this dataset."""
        manifest_file, manifest = tfrecords.read_manifest(files) if files else (None, None)
        layout = layout_of(manifest_file, manifest, **self.config)
        spec = tfrecords.RecordSpec.for_format(
            str(layout["format"]), layout["stored_size"], self.compression, **self.keys
        )
        return spec, manifest, layout["resize_mode"]

    def _files(self, spec: tfrecords.RecordSpec, list_bad: bool) -> dict[str, list[str]]:
        """Each split's files, globs expanded, empty files left out, every file labeled; `list_bad`: a file whose
        first frame is broken is kept, for the data check to list."""
        first = _broken_first_kept if list_bad else tfrecords.inspect_first
        files = {}
        for split, patterns in self.patterns.items():
            paths = tfrecords.expand(patterns, f"dataset.{split}_files")
            labeled = tfrecords.without_empty(paths, spec, f"dataset.{split}_files", first)
            for path in paths:
                if labeled.get(path) is False:
                    raise DataError(
                        f"{path}: records have no '{spec.label_key}' feature; dataset.{split}_files "
                        f"must be labeled (predict unlabeled files with mode=predict)"
                    )
            files[split] = list(labeled)
        return files

    def _class_names(self, manifest_file: str | None, manifest: dict | None) -> list[str]:
        """The classes the labels index: the converter's manifest's, else `dataset.class_names`, else the
        classic files' two (cat, dog).

        Raises:
            DataError: `dataset.num_classes` contradicts the manifest, or names no list of classes.
        """
        listed = (manifest or {}).get("class_names")
        if listed:
            if self.num_classes is not None and self.num_classes != len(listed):
                raise DataError(
                    f"{manifest_file}: lists {len(listed)} classes but dataset.num_classes={self.num_classes}; "
                    f"leave it unset (null) to take the manifest's"
                )
            given = [name.casefold() for name in self.class_names or []]
            if self.class_names is not None and given != [name.casefold() for name in listed]:
                log.warning(
                    "dataset.class_names=%s differ from the classes %s of %s: the manifest's win",
                    self.class_names,
                    listed,
                    manifest_file,
                )
            return list(listed)
        if self.class_names is not None:
            if self.num_classes is not None and self.num_classes != len(self.class_names):
                raise DataError(f"dataset.class_names={self.class_names} is not num_classes={self.num_classes} names")
            return list(self.class_names)
        if self.num_classes not in (None, len(CLASSIC_CLASSES)):
            raise DataError(
                f"dataset.num_classes={self.num_classes}: set dataset.class_names to name them (no manifest.json "
                f"beside the files lists them)"
            )
        return list(CLASSIC_CLASSES)

    def load(self, list_bad: bool = False) -> Splits:
        """The splits; `list_bad`: what counting the records (no manifest) would refuse, a corrupted frame or a
        label out of range, is left to the data check, which lists it as it reads the records
        (`trainer.data.tfrecords.readable_rest` past a corrupted frame), instead of stopping the load; a frame cut
        inside its header, which that read does not meet, comes to it listed (`Splits.skipped`)."""
        first = tfrecords.expand(self.patterns["train"], "dataset.train_files")
        spec, manifest, resize_mode = self.spec(first)
        files = self._files(spec, list_bad)
        manifest_file = tfrecords.read_manifest(files["train"])[0]
        class_names = self._class_names(manifest_file, manifest)
        num_classes = len(class_names)
        listed: list[dict] | None = [] if list_bad else None  # bad records the check's read will not meet
        records = {
            split: Records.whole_files(paths, _count(paths, manifest, split, spec, num_classes, listed))
            for split, paths in files.items()
        }
        log.info(
            "Dataset %s (%s, %dx%d, %d shards): %s records, classes %s <dataset=%s>",
            self.name,
            spec.format,
            spec.stored_size,
            spec.stored_size,
            sum(map(len, files.values())),
            {split: part.count for split, part in records.items()},
            class_names,
            self.name,
        )
        from_manifest = {
            split: records[split].count for split, paths in files.items() if _manifest_entry(manifest, split, paths)
        }
        readers = {
            split: TFRecordReader(tfrecords.compression_of(paths, spec.compression)) for split, paths in files.items()
        }
        return Splits(
            {split: Source(part, readers[split]) for split, part in records.items()},
            TFRecordDecoder(spec, num_classes, resize_mode=resize_mode),  # trained as served (serve_bytes)
            class_names,
            lambda: (files["train"], _file_counts(files["train"], manifest, spec)),
            {split: entry["per_class"] for split, entry in (manifest or {}).get("splits", {}).items()},
            broken_frame_finder(files, spec, (manifest_file, from_manifest)),
            skipped=listed or [],
            resize_mode=resize_mode,
            photos=spec.format != "raw",
        )

    def predict_chunks(self, files: list, preprocess, num_classes: int, batch_size: int):
        spec, _, resize_mode = self.spec([str(file) for file in files])
        return tfrecord_chunks(files, spec, preprocess, num_classes, batch_size, resize_mode)
