"""From the dataset section to ready tf.data pipelines and what the model needs: the one reader of `cfg.dataset`.

    python run.py mode=train dataset=cifar dataset.data_dir=/data/cifar10

`load_data` builds the dataset part that `dataset._target_` names (`trainer.data.parts`),
which finds and checks the data, then builds every split with the one pipeline
(`trainer.data.pipeline`) from the part's sources and decoder, and returns with them
the input shape, resize, normalization and model-side augmentation the model is built
with, so no task reads the dataset section twice.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from trainer.data import cache as data_cache
from trainer.data import folds, own_parts, pipeline, shares
from trainer.data.augmentation import Augmentation
from trainer.data.formats.base import DatasetConfig
from trainer.data.mixing import Mixing
from trainer.data.parts import DatasetPart, Splits
from trainer.data.preprocess import Preprocess
from trainer.data.sources import Source
from trainer.errors import ConfigError, DataError, one_line
from trainer.targets import build_target

log = logging.getLogger(__name__)

WORKER_SEED_STRIDE = 7919  # input pipeline i seeds with seed + i * stride: apart from each pipeline's own seed + 1


def _pipeline(name: str, doc: str) -> functools.cached_property:
    """A pipeline of `Data`, built by `Data.pipelines[name]` when first read: a task builds only what it reads
    (`mode=evaluate` no training pipeline), and training's first step waits for none it reads later."""

    def build(data: Data) -> tf.data.Dataset:
        return data.pipelines[name]()

    build.__doc__ = doc
    return functools.cached_property(build)


@dataclass
class Data:
    """The three splits of one dataset, ready for `fit`/`evaluate`, and what the model is built with."""

    train = _pipeline("train", "Shuffled, augmented, endless training batches (`trainer.data.pipeline`).")
    train_plain = _pipeline("train_plain", "The training split once, in order, with the evaluation preprocessing.")
    val = _pipeline("val", "The validation split once, in order.")
    test = _pipeline("test", "The test split once, in order.")
    test_stored = _pipeline("test_stored", "The test split as a client holds it: resized to resize_to, not cropped.")

    pipelines: dict[str, Callable[[], tf.data.Dataset]]  # each of the five above, built when first read
    num_examples: dict[str, int]  # records per split
    class_names: list[str]
    input_shape: tuple[int, int, int]
    resize_to: int  # evaluation: stored images resized to this side before the centre crop to input_shape
    normalization: str  # the model's normalization layer: standardize | caffe | none
    resize_mode: str  # how encoded images are made square before the resize (`trainer.data.decode`)
    augment: Augmentation  # its model view becomes the training wrapper's random layers
    class_counts: dict[str, dict[str, int]] | None = None  # per split, when known without reading the images
    # Under multi-worker training, the train pipeline of one worker's share
    # (`trainer.distribute.strategies.distribute_training_data`).
    train_for_worker: Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None
    train_steps: int | None = None  # the steps of one pass over the training split (multi-worker: every share's)
    train_left_out: int = 0  # training records an epoch of `train_steps` steps leaves out (`pipeline.pass_batches`)
    # The same training input from batch N of its stream on: (train, train_for_worker), for a resumed run.
    train_from: Callable[[int], tuple[tf.data.Dataset, Callable | None]] | None = None
    # Names what the pipeline's error could not (a corrupted frame; raises a DataError); None: nothing to name.
    find_bad_record: Callable[[Exception], None] | None = None
    # Per split: its record count and [file name, bytes, sampled sha256, first record, records or -1] per range
    # (or the part's own: a folder's file list).
    fingerprint: dict = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)  # files the part left out, each {"file", "reason"}
    files: list[str] = field(default_factory=list)  # every file the splits read (the whole-file checksum's)
    cache: dict[str, dict] = field(default_factory=dict)  # per cached split, its cache (`Cache.entry`)
    val_is_test: bool = False  # the validation split reads the test records (val_source=test, or no room for it)
    # A split's labels in order, no image decoded where the decoder can read labels alone (start-up checks).
    labels_of: Callable[[str], np.ndarray] | None = None

    @contextlib.contextmanager
    def named_bad_records(self) -> Iterator[None]:
        """A bad record met inside a pipeline (TensorFlow's error names no file) as one line naming its file
        and record, found by `find_bad_record`; any other failed check of the pipeline as one line too."""
        try:
            yield
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            if self.find_bad_record is not None:
                self.find_bad_record(error)
            raise DataError(f"bad input data: {one_line(error)}") from None


def build_part(dataset: DatasetConfig) -> DatasetPart:
    """The dataset part `dataset._target_` names (`trainer.data.parts`): a built-in format is the checked section
    itself (`trainer.data.formats`); any other target is called with the section's part keys and the side the
    stored images are resized to."""
    kind = type(dataset)
    if dataset._target_ == f"{kind.__module__}.{kind.__qualname__}":
        return dataset
    return build_target("dataset", dataset._target_, dataset.part_options(), image_size=dataset.resize_to)


def _worker_input(
    splits: Splits, num_workers: int, batch_size: int, build: Callable[[Source, int, int], tf.data.Dataset]
) -> tuple[Callable[[tf.distribute.InputContext], tf.data.Dataset], int]:
    """Plans the workers' shares of the train records and returns the `distribute_datasets_from_function`
    argument, with which each input pipeline builds only its own share, `build(source, per_replica_batch,
    seed_offset)`, and logs it, and the steps per epoch that every share holds. Each pipeline gets its own
    seed offset, so workers do not draw the same shuffles and crops at each step."""
    train = splits.sources["train"]
    # The train records are the first `count` records of the train files (binary data holds out its
    # validation records at the end).
    plan = shares.plan(*splits.train_files(), num_workers, batch_size // num_workers, train.count)

    def train_for(context: tf.distribute.InputContext) -> tf.data.Dataset:
        index, total = context.input_pipeline_id, context.num_input_pipelines
        if total != len(plan.workers):
            raise ValueError(f"the shares were planned for {len(plan.workers)} input pipelines, not {total}")
        log.info("Input pipeline %d of %d reads %s <strategy=multi_worker>", index + 1, total, plan.describe(index))
        share = Source(plan.workers[index], train.reader)
        return build(share, context.get_per_replica_batch_size(batch_size), WORKER_SEED_STRIDE * index)

    return train_for, plan.steps_per_epoch


def _fold(splits: Splits, dataset: DatasetConfig, seed: int, num_workers: int) -> Splits:
    """Fold `dataset.fold` of `dataset.folds` validates, the others train (`trainer.data.folds`)."""
    if num_workers > 1:
        raise ConfigError(
            "dataset.folds: cross-validation runs on one worker (its folds are chosen record by record); "
            "use strategy=single or strategy=mirrored"
        )
    splits = folds.fold_splits(splits, dataset.folds, dataset.fold, seed)
    log.info(
        "Fold %d of %d validates: %d records; the other folds train: %d records (stratified by class, seed %d) "
        "<dataset.folds=%d dataset.fold=%d>",
        dataset.fold, dataset.folds, splits.sources["val"].count, splits.sources["train"].count, seed,
        dataset.folds, dataset.fold,
    )  # fmt: skip
    return splits


def normalization_for(dataset: DatasetConfig, model_preprocessing: str | None) -> str:
    """What the model expects: `caffe` for ImageNet weights, else per-image standardization if the dataset asks."""
    if model_preprocessing == "caffe":
        return "caffe"
    return "standardize" if dataset.standardize else "none"


SAMPLE_BYTES = 1 << 16  # the fingerprint reads 64 KiB at the start, middle and end of each file (local or gs://)


def _sampled_sha256(path: str, size: int) -> str:
    """SHA-256 of three 64 KiB samples of a file (all of a small file): other labels or pixels in
    files of the same names and sizes change it, and a dataset of any size costs three reads a file."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        for offset in sorted({0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def _read_files(splits: Splits, sources: dict[str, Source]) -> list[str]:
    """The files the whole-file checksum reads: the part's own list (`[]`: none to read), else the sources'."""
    if splits.files is not None:
        return splits.files
    return list(dict.fromkeys(path for source in sources.values() for path in source.records.files))


def fingerprint(sources: dict[str, Source]) -> dict:
    """What identifies each split's data: its record count and, per file range, the file's name (not its folder:
    a moved copy is the same data), its size, a sampled checksum and the records read from it."""
    files = {}
    for source in sources.values():
        for path in source.records.files:
            if path not in files:
                size = tf.io.gfile.stat(path).length
                files[path] = [posixpath.basename(path), size, _sampled_sha256(path, size)]
    return {
        split: {
            "records": source.count,
            "files": [[*files[path], start, length] for path, start, length in source.records.ranges],
        }
        for split, source in sorted(sources.items())
    }


def load_data(
    dataset: DatasetConfig,
    batch_size: int,
    seed: int,
    model_preprocessing: str | None = None,
    check_val: bool = True,
    num_workers: int = 1,
    replicas: int = 1,
    reads: tuple[str, ...] | None = None,
) -> Data:
    """Every split of `dataset` as a pipeline, and what the model needs.

    Args:
        dataset: The dataset section (its schema picks the format).
        batch_size: The global batch size.
        seed: Seeds the shuffles and the host's augmentation.
        model_preprocessing: `model.preprocessing`: `caffe` overrides the dataset's normalization.
        check_val: False for a caller that never reads the validation split (binary data then skips the
            `dataset.val_size` check).
        num_workers: The input pipelines of a multi-worker training run, each of which reads its own share.
        replicas: The replicas a global training batch is split among (the last batch of an epoch is cut to a
            multiple of them: `trainer.data.pipeline.pass_batches`).
        reads: The splits the caller reads, where it reads fewer than all: a part that takes `reads` (a folder)
            checks only theirs; the others' pipelines are built but must not be read. With `dataset.folds` every
            split is checked (a fold of train and val validates).
    """
    part = build_part(dataset)
    if own_parts.is_own(dataset._target_):  # held to the protocol once: one line, not a late crash
        splits = own_parts.load(part, dataset._target_, check_val)
    elif reads is not None and not dataset.folds and "reads" in inspect.signature(part.load).parameters:
        splits = part.load(check_val, reads=tuple(reads))
    else:
        splits = part.load(check_val)
    if dataset.folds:
        splits = _fold(splits, dataset, seed, num_workers)
    preprocess = Preprocess(image_size=dataset.resize_to, augment=dataset.augment)
    decoder, sources = splits.decoder, splits.sources
    data_fingerprint = splits.fingerprint or fingerprint(sources)
    side = preprocess.image_size or preprocess.output_size
    cache = data_cache.choose(
        dataset.cache,
        splits.photos,
        (sources["train"].count + sources["val"].count) * side * side * 3,  # the splits read every epoch
        dataset.cache_memory_mb,
        dataset.cache_dir,
        data_cache.identity_of(data_fingerprint, preprocess.image_size, splits.resize_mode),
    )
    mixing = Mixing.of(dataset.augment, len(splits.class_names))

    def train(source: Source, batch: int, offset: int, start: int = 0) -> tf.data.Dataset:
        return pipeline.train_dataset(
            source, decoder, preprocess, batch, seed + offset, dataset.shuffle_buffer, cache, mixing, start, replicas
        )

    def train_from(start: int) -> tuple[tf.data.Dataset, Callable | None]:
        build = lambda source, batch, offset: train(source, batch, offset, start)  # noqa: E731
        for_worker = _worker_input(splits, num_workers, batch_size, build)[0] if num_workers > 1 else None
        return build(sources["train"], batch_size, 0), for_worker

    train_for_worker, train_count = None, sources["train"].count
    train_steps, left_out = pipeline.pass_batches(train_count, batch_size, replicas)
    if num_workers > 1:  # every worker the same whole steps: the records beyond them wait for a later epoch
        train_for_worker, train_steps = _worker_input(splits, num_workers, batch_size, train)
        left_out = train_count - train_steps * batch_size
    size = preprocess.output_size
    evaluated = functools.partial(pipeline.eval_dataset, decoder=decoder, preprocess=preprocess, batch_size=batch_size)
    stored = Preprocess(preprocess.image_size)  # resized to what the model is served, not cropped
    return Data(
        pipelines={
            "train": lambda: train(sources["train"], batch_size, 0),
            "train_plain": lambda: evaluated(sources["train"]),
            "val": lambda: evaluated(sources["val"], cache=cache),
            # On disk the test split is kept too: each trial of a sweep, and each later run, evaluates from it. In
            # memory a pass cut short (the step state's first batch) would throw its filling away.
            "test": lambda: evaluated(sources["test"], cache=cache if cache.mode == "disk" else None),
            "test_stored": lambda: evaluated(sources["test"], preprocess=stored),
        },
        num_examples={split: source.count for split, source in sources.items()},
        class_names=splits.class_names,
        input_shape=(size, size, 3),
        resize_to=preprocess.image_size,
        normalization=normalization_for(dataset, model_preprocessing),
        resize_mode=splits.resize_mode,
        augment=dataset.augment,
        class_counts=splits.class_counts,
        train_for_worker=train_for_worker,
        train_steps=train_steps,
        train_left_out=left_out,
        train_from=train_from,
        find_bad_record=splits.find_bad_record,
        fingerprint=data_fingerprint,
        cache={split: cache.entry(sources[split].records.ranges) for split in ("train", "val")},
        skipped=splits.skipped,
        files=_read_files(splits, sources),
        val_is_test=sources["val"].records.ranges == sources["test"].records.ranges,
        labels_of=lambda split: folds.read_labels(sources[split], decoder),
    )
