"""From the dataset section to the data module the tasks read: the one reader of `cfg.dataset`.

    python run.py mode=train dataset=cifar dataset.data_dir=/data/cifar10

`load_data` builds the dataset part that `dataset._target_` names (`trainer.data.parts`),
which finds and checks the data, and hands what it found to `trainer.data.module.DataModule`
with the section's keys as plain arguments: the splits, the training stream, and the input
shape, resize, normalization and model-side augmentation the model is built with, so no
task reads the dataset section twice.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging

from trainer.data import cache, folds, own_parts
from trainer.data.formats.base import DatasetConfig
from trainer.data.module import DataModule, TrainInput
from trainer.data.parts import DatasetPart, Splits
from trainer.data.preprocess import Preprocess
from trainer.errors import ConfigError
from trainer.targets import build_target

log = logging.getLogger(__name__)


def build_part(dataset: DatasetConfig) -> DatasetPart:
    """The dataset part `dataset._target_` names (`trainer.data.parts`): a built-in format is the checked section
    itself (`trainer.data.formats`); any other target is called with the section's part keys and the side the
    stored images are resized to."""
    kind = type(dataset)
    if dataset._target_ == f"{kind.__module__}.{kind.__qualname__}":
        return dataset
    return build_target("dataset", dataset._target_, dataset.part_options(), image_size=dataset.resize_to)


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


def load_data(
    dataset: DatasetConfig,
    batch_size: int,
    seed: int,
    model_preprocessing: str | None = None,
    check_val: bool = True,
    num_workers: int = 1,
    replicas: int = 1,
    reads: tuple[str, ...] | None = None,
    check_records: bool = True,
    list_bad: bool = False,
) -> DataModule:
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
        check_records: False: the part's check of every record (`Splits.check`) is left to the caller's
            `DataModule.check_records` (training runs it after its first step). With `dataset.folds` it runs
            here, before the folds read the labels.
        list_bad: The data check (`inspect.check`): a part that takes `list_bad` leaves what it would refuse while
            loading (a corrupted TFRecord frame) to the check, which lists it, rather than stopping.
    """
    cache.forget_refusals()  # a cache folder the disk refused: one warning per load of the data
    part = build_part(dataset)
    if own_parts.is_own(dataset._target_):  # held to the protocol once: one line, not a late crash
        splits = own_parts.load(part, dataset._target_, check_val)
    else:
        takes = inspect.signature(part.load).parameters
        options = {"list_bad": True} if list_bad and "list_bad" in takes else {}
        if reads is not None and not dataset.folds and "reads" in takes:
            options["reads"] = tuple(reads)
        splits = part.load(check_val, **options)
    if dataset.folds:
        if splits.check is not None:  # every label checked before the folds read them
            splits.check()
            splits = dataclasses.replace(splits, check=None)
        splits = _fold(splits, dataset, seed, num_workers)
    return DataModule.build(
        splits,
        Preprocess(image_size=dataset.resize_to, augment=dataset.augment),
        TrainInput(batch_size, seed, dataset.shuffle_buffer, replicas, num_workers),
        dataset.cache,
        (dataset.cache_memory_mb, dataset.cache_dir),
        normalization_for(dataset, model_preprocessing),
        dataset.augment,
        check_records,
    )
