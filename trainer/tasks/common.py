"""Pieces every task shares: the strategy, the run folder, and evaluating a checkpoint with its reports."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework import config as tf_config  # disable_op_determinism has no public alias

from trainer import checkpoints, distribute, evaluation
from trainer.cluster import WORKER_PREFIX
from trainer.config import Config
from trainer.reports import plot_confusion_png, write_confusion_csv
from trainer.tasks.data import Data

log = logging.getLogger(__name__)


def setup_threads(threads: int) -> None:
    """Caps TensorFlow's intra-op threads (0 leaves its default); must run before the runtime starts."""
    if not threads:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
        log.info("TensorFlow threads: %d intra-op <trainer.threads=%d>", threads, threads)
    except RuntimeError:  # a reused worker process (joblib) whose runtime already started
        log.info(
            "TensorFlow already running with %d intra-op threads",
            tf.config.threading.get_intra_op_parallelism_threads(),
        )


def setup_strategy(settings: Config) -> tf.distribute.Strategy:
    """Builds the strategy first (it may split the CPU) and checks the global batch against it."""
    setup_threads(settings.trainer.threads)
    if settings.trainer.deterministic:
        tf.config.experimental.enable_op_determinism()
        log.info("Op determinism on <trainer.deterministic=true>")
        if settings.trainer.jit_compile == "true":
            log.warning("Keras turns XLA off under op determinism <trainer.deterministic=true>")
    else:  # process-wide in TensorFlow: a run in the same process must not inherit an earlier one's setting
        tf_config.disable_op_determinism()
    strategy = distribute.build_strategy(**vars(settings.strategy))
    distribute.per_replica_batch(settings.trainer.batch_size, strategy)
    return strategy


@contextlib.contextmanager
def run_folder(output_dir: str, chief: bool) -> Iterator[Path]:
    """The folder this process writes to: the run folder for the chief, else a temporary one it removes."""
    if chief:
        path = Path(output_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=WORKER_PREFIX))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if Path(output_dir).name.startswith(WORKER_PREFIX):  # Hydra's folder for this worker
            shutil.rmtree(output_dir, ignore_errors=True)


def evaluate_checkpoint(
    strategy: tf.distribute.Strategy, checkpoint: str | Path, data: Data, split: str, run_dir: Path
) -> dict:
    """Loads a checkpoint, checks that `data` fits it, evaluates it on `split` in one pass and writes the
    confusion matrix as CSV and PNG.

    Returns:
        The metrics of `trainer.evaluation.evaluate`, plus the checkpoint's path.

    Raises:
        DataError: the data's class names or image size differ from the model's.
    """
    class_names = data.class_names
    with strategy.scope():
        model, info = checkpoints.load(checkpoint)
        checkpoints.check_data(checkpoints.resolve(checkpoint), info, class_names, data.input_shape[0], "the dataset")
        evaluation.compile_for_evaluation(model, len(class_names))
    metrics, matrix = evaluation.evaluate(model, getattr(data, split), class_names)
    write_confusion_csv(run_dir / f"confusion_matrix_{split}.csv", matrix, class_names)
    plot_confusion_png(
        run_dir / f"confusion_matrix_{split}.png",
        matrix,
        class_names,
        f"{split} split: accuracy {metrics['accuracy']:.4f}",
    )
    metrics["checkpoint"] = str(checkpoints.resolve(checkpoint))
    log.info(
        "Evaluated %s on %s: accuracy %.4f, loss %.4f over %d examples",
        metrics["checkpoint"],
        split,
        metrics["accuracy"],
        metrics["loss"],
        metrics["num_examples"],
    )
    return metrics
