"""From a dataset config to ready tf.data pipelines: the one place that reads `cfg.dataset`.

python run.py mode=train dataset=cifar dataset.data_dir=/data/cifar10
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import tensorflow as tf

from trainer.config import BinaryDatasetConfig
from trainer.data import pipeline, records
from trainer.data.augment import Augmentation, Preprocess

log = logging.getLogger(__name__)


@dataclass
class Data:
    """The three splits of one dataset, ready for `fit`/`evaluate`."""

    train: tf.data.Dataset
    val: tf.data.Dataset
    test: tf.data.Dataset
    num_examples: dict[str, int]  # records per split
    class_names: list[str]
    input_shape: tuple[int, int, int]


def binary_format(dataset: BinaryDatasetConfig) -> records.RecordFormat:
    return records.RecordFormat(
        dataset.height,
        dataset.width,
        dataset.channels,
        dataset.label_bytes,
        dataset.label_index,
    )


def binary_preprocess(dataset: BinaryDatasetConfig) -> Preprocess:
    return Preprocess(
        image_size=dataset.image_size or dataset.height,
        augment=Augmentation(**dataclasses.asdict(dataset.augment)),
        standardize=dataset.standardize,
    )


def load_binary(dataset: BinaryDatasetConfig, batch_size: int, seed: int) -> Data:
    """Finds (or downloads), checks and splits the record files, then builds the pipelines."""
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
    )
    preprocess = binary_preprocess(dataset)
    size = preprocess.output_size
    counts = {name: split.count for name, split in splits.items()}
    log.info("Dataset %s from %s: %s records <dataset=%s>", dataset.name, paths[0].parent, counts, dataset.name)
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
        val=pipeline.eval_dataset(splits["val"], fmt, preprocess, batch_size, dataset.cache),
        test=pipeline.eval_dataset(splits["test"], fmt, preprocess, batch_size),
        num_examples=counts,
        class_names=list(dataset.class_names),
        input_shape=(size, size, 3),
    )


LOADERS = {BinaryDatasetConfig: load_binary}


def load_data(dataset, batch_size: int, seed: int) -> Data:
    """Dispatches on the dataset schema (`conf/dataset/*.yaml` picks it)."""
    return LOADERS[type(dataset)](dataset, batch_size, seed)
