"""From a dataset config to ready tf.data pipelines: the one place that reads `cfg.dataset`.

python run.py mode=train dataset=cifar dataset.data_dir=/data/cifar10
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tensorflow as tf

from trainer import distribute
from trainer.config import BinaryDatasetConfig, TFRecordDatasetConfig
from trainer.data import pipeline, records, shares, tfrecords
from trainer.data.augment import Augmentation, Preprocess
from trainer.errors import DataError
from trainer.models.preprocessing import ModelAugmentation

log = logging.getLogger(__name__)


@dataclass
class Data:
    """The three splits of one dataset, ready for `fit`/`evaluate`."""

    train: tf.data.Dataset
    train_plain: tf.data.Dataset  # the training split once, in order, with the evaluation preprocessing
    val: tf.data.Dataset
    test: tf.data.Dataset
    num_examples: dict[str, int]  # records per split
    class_names: list[str]
    input_shape: tuple[int, int, int]
    resize_to: int  # evaluation: stored images resized to this side before the centre crop to input_shape
    class_counts: dict[str, dict[str, int]] | None = None  # per split, when known without reading the images
    # Under multi-worker training, the train pipeline of one worker's share (`distribute.training_input`).
    train_for_worker: Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None
    train_steps: int | None = None  # multi-worker: the steps per epoch that every worker's share holds
    # Reads the files again to name the one holding a bad record (raises a DataError); None: checked at start-up.
    find_bad_record: Callable[[], None] | None = None

    @contextlib.contextmanager
    def named_bad_records(self) -> Iterator[None]:
        """A bad record met inside a pipeline (TensorFlow's error names no file) as one line naming its file
        and record, found by `find_bad_record`; any other failed check of the pipeline as one line too."""
        try:
            yield
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            if self.find_bad_record is not None:
                self.find_bad_record()
            raise DataError(f"bad input data: {distribute.error_reason(error)}") from None


def binary_format(dataset: BinaryDatasetConfig) -> records.RecordFormat:
    return records.RecordFormat(
        dataset.height,
        dataset.width,
        dataset.channels,
        dataset.label_bytes,
        dataset.label_index,
    )


HOST_AUGMENTATION = tuple(field.name for field in dataclasses.fields(Augmentation))
MODEL_AUGMENTATION = tuple(field.name for field in dataclasses.fields(ModelAugmentation))


def dataset_preprocess(dataset) -> Preprocess:
    """The host's part of a dataset config: resize and crops (binary data at image_size 0
    keeps its size)."""
    augment = {key: getattr(dataset.augment, key) for key in HOST_AUGMENTATION}
    return Preprocess(image_size=dataset.image_size or dataset.height, augment=Augmentation(**augment))


def model_augmentation(dataset) -> ModelAugmentation:
    """The model's part of the dataset's augmentation: flip, brightness and contrast (training only)."""
    return ModelAugmentation(**{key: getattr(dataset.augment, key) for key in MODEL_AUGMENTATION})


WORKER_SEED_STRIDE = 7919  # input pipeline i seeds with seed + i * stride: apart from each pipeline's own seed + 1


def _worker_input(
    files: list[str],
    file_counts: list[int],
    num_workers: int,
    batch_size: int,
    build: Callable[[shares.WorkerShare, int, int], tf.data.Dataset],
    limit: int | None = None,
) -> tuple[Callable[[tf.distribute.InputContext], tf.data.Dataset], int]:
    """Plans the workers' shares of the train records (the first `limit` of `files`) and returns the
    `distribute_datasets_from_function` argument, with which each input pipeline builds only its own share,
    `build(share, per_replica_batch, seed_offset)`, and logs it, and the steps per epoch that every share holds.
    Each pipeline gets its own seed offset, so workers do not draw the same shuffles and crops at each step."""
    plan = shares.plan(files, file_counts, num_workers, batch_size // num_workers, limit)

    def train_for(context: tf.distribute.InputContext) -> tf.data.Dataset:
        index, total = context.input_pipeline_id, context.num_input_pipelines
        if total != len(plan.workers):
            raise ValueError(f"the shares were planned for {len(plan.workers)} input pipelines, not {total}")
        log.info("Input pipeline %d of %d reads %s <strategy=multi_worker>", index + 1, total, plan.describe(index))
        return build(plan.workers[index], context.get_per_replica_batch_size(batch_size), WORKER_SEED_STRIDE * index)

    return train_for, plan.steps_per_epoch


def load_binary(
    dataset: BinaryDatasetConfig, batch_size: int, seed: int, check_val: bool = True, num_workers: int = 1
) -> Data:
    """Finds (or downloads), checks and splits the record files, then builds the pipelines; without
    `check_val` (the caller never reads the validation split) an unfitting `dataset.val_size` is no error.
    With `num_workers` > 1 (multi-worker training) each worker also gets a pipeline of its own share."""
    url = dataset.url if dataset.download else None
    names = list(dataset.train_files) + list(dataset.test_files)
    paths = records.locate(dataset.data_dir, names, list(dataset.search_subdirs), url, dataset.md5)
    num_train_files = len(dataset.train_files)
    fmt = binary_format(dataset)
    splits = records.make_splits(
        paths[:num_train_files],
        paths[num_train_files:],
        fmt,
        dataset.num_classes,
        dataset.val_size,
        dataset.val_source,
        check_val,
    )
    preprocess = dataset_preprocess(dataset)
    size = preprocess.output_size
    counts = {name: split.count for name, split in splits.items()}
    log.info("Dataset %s from %s: %s records <dataset=%s>", dataset.name, paths[0].parent, counts, dataset.name)
    train_for_worker, train_steps = None, None
    if num_workers > 1:
        source = splits["train"]  # records [0, count) of the train files: the validation records come after

        def build(share: shares.WorkerShare, per_replica: int, offset: int) -> tf.data.Dataset:
            return pipeline.train_dataset(
                share, fmt, preprocess, per_replica, seed + offset, dataset.shuffle_buffer, dataset.cache
            )

        file_counts = [records.count_records(path, fmt) for path in source.files]
        train_for_worker, train_steps = _worker_input(
            list(source.files), file_counts, num_workers, batch_size, build, source.count
        )
    return Data(
        train=pipeline.train_dataset(
            splits["train"],
            fmt,
            preprocess,
            batch_size,
            seed,
            dataset.shuffle_buffer,
            dataset.cache,
        ),
        train_plain=pipeline.eval_dataset(splits["train"], fmt, preprocess, batch_size),
        val=pipeline.eval_dataset(splits["val"], fmt, preprocess, batch_size, dataset.cache),
        test=pipeline.eval_dataset(splits["test"], fmt, preprocess, batch_size),
        num_examples=counts,
        class_names=list(dataset.class_names),
        input_shape=(size, size, 3),
        resize_to=preprocess.image_size,
        train_for_worker=train_for_worker,
        train_steps=train_steps,
    )


def record_spec(dataset: TFRecordDatasetConfig) -> tfrecords.RecordSpec:
    return tfrecords.RecordSpec.for_format(
        dataset.format,
        dataset.stored_size,
        dataset.compression,
        image=dataset.image_key,
        label=dataset.label_key,
        filename=dataset.filename_key,
    )


def _counts(files: list[str], manifest: dict | None, split: str, spec, num_classes: int) -> int:
    """Records in a split: from the converter's manifest when it lists exactly these files, else counted
    (every checksum and label checked on the way)."""
    entry = (manifest or {}).get("splits", {}).get(split)
    if entry and sorted(entry["files"]) == sorted(file.rsplit("/", 1)[-1] for file in files):
        return int(entry["count"])
    return sum(tfrecords.count_records(file, spec, num_classes) for file in files)


def _file_counts(files: list[str], manifest: dict | None, split: str, spec) -> list[int]:
    """Records per file: from the converter's manifest when it lists them for exactly these files, else counted."""
    entry = (manifest or {}).get("splits", {}).get(split) or {}
    listed = dict(zip(entry.get("files", []), entry.get("file_counts", []), strict=False))
    names = [file.rsplit("/", 1)[-1] for file in files]
    if len(listed) == len(entry.get("files", [])) and sorted(listed) == sorted(names):
        return [int(listed[name]) for name in names]
    log.info("Counting the records of %d %s file(s) for the worker shares <strategy=multi_worker>", len(files), split)
    return [tfrecords.count_records(file, spec) for file in files]


def _bad_record_finder(files: dict[str, list[str]], spec: tfrecords.RecordSpec, num_classes: int):
    """`Data.find_bad_record` for TFRecords (with a manifest, no file was read whole at start-up): every
    file of every split is read once, checksums and labels checked, until one fails."""
    paths = list(dict.fromkeys(path for split in files.values() for path in split))

    def find() -> None:
        log.warning("A bad record stopped the input pipeline; reading the %d record files to name it", len(paths))
        for path in paths:
            tfrecords.scan_file(path, spec, num_classes)  # raises a DataError naming the file and record

    return find


def load_tfrecords(dataset: TFRecordDatasetConfig, batch_size: int, seed: int, num_workers: int = 1) -> Data:
    """Expands the globs, checks each file's first record, counts the records and builds the pipelines.
    With `num_workers` > 1 (multi-worker training) each worker also gets a pipeline of its own share, planned
    from each train file's record count (the manifest's `file_counts`, else counted here)."""
    spec = record_spec(dataset)
    files = {
        split: tfrecords.expand(list(getattr(dataset, f"{split}_files")), f"dataset.{split}_files")
        for split in ("train", "val", "test")
    }
    for split, paths in files.items():
        for path in paths:
            if not tfrecords.inspect_first(path, spec):
                raise DataError(
                    f"{path}: records have no '{spec.label_key}' feature; dataset.{split}_files "
                    f"must be labeled (predict unlabeled files with mode=predict)"
                )
    manifest_file, manifest = tfrecords.read_manifest(files["train"])
    class_names = list((manifest or {}).get("class_names") or dataset.class_names)
    if len(class_names) != dataset.num_classes:
        raise DataError(
            f"{manifest_file}: lists {len(class_names)} classes but dataset.num_classes={dataset.num_classes}"
        )
    counts = {split: _counts(paths, manifest, split, spec, dataset.num_classes) for split, paths in files.items()}
    preprocess = dataset_preprocess(dataset)
    train_for_worker, train_steps = None, None
    if num_workers > 1:

        def build(share: shares.WorkerShare, per_replica: int, offset: int) -> tf.data.Dataset:
            return tfrecords.train_dataset(
                share, spec, preprocess, dataset.num_classes, per_replica, seed + offset, dataset.shuffle_buffer
            )

        file_counts = _file_counts(files["train"], manifest, "train", spec)
        train_for_worker, train_steps = _worker_input(files["train"], file_counts, num_workers, batch_size, build)
    log.info(
        "Dataset %s (%s, %d shards): %s records, classes %s <dataset=%s>",
        dataset.name,
        dataset.format,
        sum(map(len, files.values())),
        counts,
        class_names,
        dataset.name,
    )
    num_classes = dataset.num_classes
    return Data(
        train=tfrecords.train_dataset(
            files["train"], spec, preprocess, num_classes, batch_size, seed, dataset.shuffle_buffer
        ),
        train_plain=tfrecords.eval_dataset(
            files["train"], spec, preprocess, num_classes, batch_size, count=counts["train"]
        ),
        val=tfrecords.eval_dataset(files["val"], spec, preprocess, num_classes, batch_size, count=counts["val"]),
        test=tfrecords.eval_dataset(files["test"], spec, preprocess, num_classes, batch_size, count=counts["test"]),
        num_examples=counts,
        class_names=class_names,
        input_shape=(preprocess.output_size, preprocess.output_size, 3),
        resize_to=preprocess.image_size,
        class_counts={split: entry["per_class"] for split, entry in (manifest or {}).get("splits", {}).items()},
        train_for_worker=train_for_worker,
        train_steps=train_steps,
        find_bad_record=_bad_record_finder(files, spec, num_classes),
    )


LOADERS = {BinaryDatasetConfig: load_binary, TFRecordDatasetConfig: load_tfrecords}


def normalization_for(dataset, model) -> str:
    """What the model expects: `caffe` for ImageNet weights, else per-image standardization if the dataset asks."""
    if getattr(model, "preprocessing", None) == "caffe":
        return "caffe"
    return "standardize" if dataset.standardize else "none"


def load_data(dataset, batch_size: int, seed: int, check_val: bool = True, num_workers: int = 1) -> Data:
    """Dispatches on the dataset schema (`conf/dataset/*.yaml` picks it); `check_val=False` for a caller
    that never reads the validation split (binary data then skips the `dataset.val_size` check);
    `num_workers`: the input pipelines of a multi-worker training run, each of which reads its own share."""
    if isinstance(dataset, BinaryDatasetConfig):
        return load_binary(dataset, batch_size, seed, check_val, num_workers)
    return LOADERS[type(dataset)](dataset, batch_size, seed, num_workers=num_workers)
