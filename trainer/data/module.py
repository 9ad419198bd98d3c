"""One dataset, ready for the tasks: `DataModule` answers the splits in order, the training stream, and what the
model is built with; the task layer asks, and this module knows how each is built.

    python run.py mode=train dataset=cifar dataset.data_dir=/data/cifar10     # trainer.tasks.data.load_data builds it

It is built from what a dataset part found (`trainer.data.parts.Splits`), plain arguments and no config:

    data = DataModule.build(splits, preprocess, TrainInput(batch_size=32, seed=0), cache_mode="auto")
    data.split("val")                  # the validation split once, in order (the evaluation preprocessing)
    data.train()                       # shuffled, augmented, endless training batches
    data.train(start_batch=400)        # the same stream from batch 400 on (a resumed run)
    data.train(0, context)             # one input pipeline's share (multi-worker: `distribute_datasets_from_function`)

Each pipeline is built when first asked for, and once: `mode=evaluate` builds no training pipeline.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from trainer.data import cache as data_cache
from trainer.data import folds, pipeline, shares
from trainer.data.augmentation import Augmentation
from trainer.data.mixing import Mixing
from trainer.data.parts import Splits
from trainer.data.preprocess import Preprocess
from trainer.data.sources import Source
from trainer.errors import DataError, one_line

log = logging.getLogger(__name__)

WORKER_SEED_STRIDE = 7919  # input pipeline i seeds with seed + i * stride: apart from each pipeline's own seed + 1
SAMPLE_BYTES = 1 << 16  # the fingerprint reads 64 KiB at the start, middle and end of each file (local or gs://)
SPLITS = ("train", "val", "test")
CARDINALITY = "Input dataset was expected to contain"  # tf.data's assert_cardinality error (TF 2.21)


@dataclass(frozen=True)
class TrainInput:
    """How training batches are drawn."""

    batch_size: int  # the global batch
    seed: int  # seeds the shuffles and the host's augmentation
    shuffle_buffer: int = 1000  # records held for shuffling
    replicas: int = 1  # a global batch is split among them (an epoch's last batch is cut to a multiple of them)
    num_workers: int = 1  # input pipelines of a multi-worker run, each reading its own share


def _sampled_sha256(path: str, size: int) -> str:
    """SHA-256 of three 64 KiB samples of a file (all of a small file): other labels or pixels in
    files of the same names and sizes change it, and a dataset of any size costs three reads a file."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        for offset in sorted({0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


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


def miscounted(error: tf.errors.OpError) -> bool:
    """Whether a pipeline's error is a split read that held another number of records than counted (tf.data's
    `assert_cardinality` of `Source.in_order`): a TFRecord file cut inside a frame's header ends its read
    quietly, short of the count its manifest gives."""
    return isinstance(error, tf.errors.FailedPreconditionError) and CARDINALITY in str(error.message)


@dataclass
class DataModule:
    """The three splits of one dataset, ready for `fit`/`evaluate`, and what the model is built with."""

    splits: Splits
    preprocess: Preprocess  # the host's preprocessing: resize to `resize_to`, crop to the input size
    batches: TrainInput
    cache: data_cache.Cache  # the decoded images kept after their first pass (`trainer.data.cache`)
    mixing: Mixing | None  # MixUp / CutMix on whole training batches
    normalization: str  # the model's normalization layer: standardize | caffe | none
    augment: Augmentation  # its model view becomes the training wrapper's random layers
    fingerprint: dict = field(default_factory=dict)  # per split: records, and per file range its identity
    _built: dict = field(default_factory=dict, repr=False)  # (kind, split) -> its pipeline, built when first read
    _checked: bool = field(default=False, repr=False)  # the part's check of every record has run

    @classmethod
    def build(
        cls,
        splits: Splits,
        preprocess: Preprocess,
        batches: TrainInput,
        cache_mode: str = "off",
        cache_place: tuple[float, str | None] = (1024.0, None),
        normalization: str = "standardize",
        augment: Augmentation | None = None,
        check_records: bool = True,
    ) -> DataModule:
        """The module of `splits`; `cache_mode` (`dataset.cache`) and `cache_place` (`dataset.cache_memory_mb`,
        `dataset.cache_dir`) choose the cache, keyed by the data's fingerprint, size and resize mode. The part's
        check of every record runs here, unless `check_records` is False: the caller then runs `check_records`
        before anything depends on the records (training: after its first step)."""
        augment = augment or preprocess.augment
        sources = splits.sources
        data_fingerprint = splits.fingerprint or fingerprint(sources)
        side = preprocess.image_size or preprocess.output_size
        cache = data_cache.choose(
            cache_mode,
            splits.photos,
            data_cache.decoded_bytes(sources["train"].count + sources["val"].count, side),
            *cache_place,
            data_cache.identity_of(data_fingerprint, preprocess.image_size, splits.resize_mode, splits.stamp),
        )
        mixing = Mixing.of(augment, len(splits.class_names))
        module = cls(splits, preprocess, batches, cache, mixing, normalization, augment, data_fingerprint)
        if check_records:
            module.check_records()
        return module

    def check_records(self) -> None:
        """The part's check of every record (`Splits.check`: binary data's labels), once.

        Raises:
            DataError: `FILE: record N REASON` for the first bad record.
        """
        if self.splits.check is not None and not self._checked:
            self._checked = True
            self.splits.check()

    # --- what the model and the run need -------------------------------------------------------------------

    @property
    def class_names(self) -> list[str]:
        return self.splits.class_names

    @property
    def class_counts(self) -> dict[str, dict[str, int]] | None:
        """Per split, when known without reading the images."""
        return self.splits.class_counts

    @property
    def num_examples(self) -> dict[str, int]:
        """Records per split."""
        return {split: source.count for split, source in self.splits.sources.items()}

    @property
    def input_shape(self) -> tuple[int, int, int]:
        size = self.preprocess.output_size
        return (size, size, 3)

    @property
    def resize_to(self) -> int:
        """Evaluation: stored images are resized to this side before the centre crop to `input_shape`."""
        return self.preprocess.image_size

    @property
    def resize_mode(self) -> str:
        """How encoded images are made square before the resize (`trainer.data.decode`)."""
        return self.splits.resize_mode

    @property
    def skipped(self) -> list[dict]:
        """Files the part left out, each {"file", "reason"}."""
        return self.splits.skipped

    @property
    def files(self) -> list[str]:
        """Every file the splits read, for the whole-file checksum: the part's own list ([]: none), else the
        sources'."""
        if self.splits.files is not None:
            return self.splits.files
        return list(dict.fromkeys(path for source in self.splits.sources.values() for path in source.records.files))

    @property
    def cache_entries(self) -> dict[str, dict]:
        """Per split read every epoch, its cache (`Cache.entry`): what `mode=inspect` shows."""
        return {split: self.cache.entry(self.splits.sources[split].records.ranges) for split in ("train", "val")}

    @property
    def val_is_test(self) -> bool:
        """The validation split reads the test records (val_source=test, or no room for it)."""
        sources = self.splits.sources
        return sources["val"].records.ranges == sources["test"].records.ranges

    def labels_of(self, split: str) -> np.ndarray:
        """A split's labels in order, no image decoded where the decoder can read labels alone."""
        return folds.read_labels(self.splits.sources[split], self.splits.decoder)

    # --- the pipelines ----------------------------------------------------------------------------------------

    def split(self, name: str, stored: bool = False) -> tf.data.Dataset:
        """Split `name` (train, val or test) once, in order, with the evaluation preprocessing; `stored`: resized
        to `resize_to` as a client holds it, not cropped."""
        if name not in SPLITS:
            raise ValueError(f"name must be one of {SPLITS}. Received: name={name}")
        return self._once(("stored" if stored else "split", name), lambda: self._evaluated(name, stored))

    def checked(self, name: str) -> tf.data.Dataset:
        """Split `name` once, in order, as (images, labels, reasons, files, numbers) batches with the evaluation
        preprocessing: every record's reason ("" for a good one), none raised (`pipeline.checked_dataset`)."""
        source = self.splits.sources[name]
        return pipeline.checked_dataset(source, self.splits.decoder, self.preprocess, self.batches.batch_size)

    def _evaluated(self, name: str, stored: bool) -> tf.data.Dataset:
        # val is read every epoch: cached. On disk the test split is kept too (each trial of a sweep, and each
        # later run, evaluates from it); in memory a pass cut short (the step state's first batch) would throw its
        # filling away. The train split in order is read once (the first batch, class counts): never cached.
        cache = {"val": self.cache, "test": self.cache if self.cache.mode == "disk" else None}.get(name)
        preprocess = Preprocess(self.preprocess.image_size) if stored else self.preprocess
        source = self.splits.sources[name]
        return pipeline.eval_dataset(source, self.splits.decoder, preprocess, self.batches.batch_size, cache=cache)

    @property
    def num_workers(self) -> int:
        return self.batches.num_workers

    @property
    def train_steps(self) -> int:
        """The steps of one pass over the training split (multi-worker: every share's)."""
        return self._steps()[0]

    @property
    def train_left_out(self) -> int:
        """Training records an epoch of `train_steps` steps leaves out (`pipeline.pass_batches`)."""
        return self._steps()[1]

    def train(self, start_batch: int = 0, context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """Shuffled, augmented, endless training batches, from batch `start_batch` of the stream on (a resumed
        run); with `context`, that input pipeline's share of the records, its per-replica batch and its own
        seed (`trainer.distribute.strategies.distribute_training_data`)."""
        if context is None:
            return self._once(("train", start_batch), lambda: self._train(self.splits.sources["train"], start_batch))
        index, total = context.input_pipeline_id, context.num_input_pipelines
        plan = self._plan()
        if total != len(plan.workers):
            raise ValueError(f"the shares were planned for {len(plan.workers)} input pipelines, not {total}")
        log.info("Input pipeline %d of %d reads %s <strategy=multi_worker>", index + 1, total, plan.describe(index))
        share = Source(plan.workers[index], self.splits.sources["train"].reader)
        batch = context.get_per_replica_batch_size(self.batches.batch_size)
        return self._train(share, start_batch, batch, WORKER_SEED_STRIDE * index)

    def _train(self, source: Source, start: int, batch: int | None = None, offset: int = 0) -> tf.data.Dataset:
        b = self.batches
        return pipeline.train_dataset(
            source, self.splits.decoder, self.preprocess, batch or b.batch_size, b.seed + offset, b.shuffle_buffer,
            self.cache, self.mixing, start, b.replicas,
        )  # fmt: skip

    def _plan(self) -> shares.SharePlan:
        """The workers' shares of the train records. The train records are the first `count` records of the
        train files (binary data holds out its validation records at the end)."""
        key = ("plan", None)
        if key not in self._built:
            b, train = self.batches, self.splits.sources["train"]
            self._built[key] = shares.plan(
                *self.splits.train_files(), b.num_workers, b.batch_size // b.num_workers, train.count
            )
        return self._built[key]

    def _steps(self) -> tuple[int, int]:
        count, batch = self.splits.sources["train"].count, self.batches.batch_size
        if self.batches.num_workers > 1:  # every worker the same whole steps: the rest waits for a later epoch
            steps = self._plan().steps_per_epoch
            return steps, count - steps * batch
        return pipeline.pass_batches(count, batch, self.batches.replicas)

    def _once(self, key: tuple, build) -> tf.data.Dataset:
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    @contextlib.contextmanager
    def named_bad_records(self) -> Iterator[None]:
        """A bad record met inside a pipeline (TensorFlow's error names no file) as one line naming its file
        and record, found by the part's `find_bad_record`; any other failed check of the pipeline as one line. A
        split read short of its count (`miscounted`: a TFRecord file cut inside a frame header) is one of them."""
        try:
            yield
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, tf.errors.FailedPreconditionError) as error:
            if isinstance(error, tf.errors.FailedPreconditionError) and not miscounted(error):
                raise
            if self.splits.find_bad_record is not None:
                self.splits.find_bad_record(error)
            raise DataError(f"bad input data: {one_line(error)}") from None
