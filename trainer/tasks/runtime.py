"""What every task sets up first: TensorFlow's threads, op determinism and the strategy; the folder it writes to.

    python run.py mode=evaluate checkpoint=RUN strategy=mirrored strategy.cpu_devices=2 trainer.threads=4

`setup_strategy` runs before any data is read: the strategy may split the CPU into
devices, which TensorFlow allows only before its runtime starts.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf

from trainer.config.groups import StrategyConfig
from trainer.config.schema import Config
from trainer.distribute import strategies
from trainer.distribute.cluster import WORKER_PREFIX
from trainer.errors import ConfigError
from trainer.targets import build_target

log = logging.getLogger(__name__)
_determinism = {"on": False}  # TensorFlow has no public call to turn op determinism off again


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


def setup_determinism(deterministic: bool, jit_compile: str) -> None:
    """Turns TensorFlow's op determinism on for `trainer.deterministic=true`. It is process-wide and has no
    public switch back, so a later run in the same process (a sweep's jobs) keeps it, and says so."""
    if deterministic:
        tf.config.experimental.enable_op_determinism()
        _determinism["on"] = True
        log.info("Op determinism on <trainer.deterministic=true>")
        if jit_compile == "true":
            log.warning("Keras turns XLA off under op determinism <trainer.deterministic=true>")
    elif _determinism["on"]:
        log.warning(
            "Op determinism stays on: an earlier run of this process turned it on, and TensorFlow cannot turn it "
            "off again <trainer.deterministic=false>"
        )


def build_strategy(options: StrategyConfig) -> tf.distribute.Strategy:
    """The strategy `strategy._target_` builds from the section's other keys, logged."""
    keys = {key: value for key, value in vars(options).items() if key not in ("_target_", "name")}
    strategy = build_target("strategy", options._target_, keys)
    strategies.describe(strategy, options.name)
    if options.name == "mirrored" and strategy.num_replicas_in_sync == 1 and not tf.config.list_physical_devices("GPU"):
        log.warning(
            "strategy=mirrored found no GPU: it mirrors over one replica, the CPU, as strategy=single does "
            "(strategy.cpu_devices=N splits the CPU into N, for tests)"
        )
    return strategy


def setup_strategy(settings: Config) -> tf.distribute.Strategy:
    """Builds the strategy first (it may split the CPU) and checks the global batch against it."""
    setup_threads(settings.trainer.threads)
    setup_determinism(settings.trainer.deterministic, settings.trainer.jit_compile)
    strategy = build_strategy(settings.strategy)
    strategies.per_replica_batch(settings.trainer.batch_size, strategy)
    return strategy


def check_replica_batches(batch: int, replicas: int, counts: dict[str, int]) -> None:
    """Refuses a global batch that leaves a replica no example in some step: smaller than the replicas, or a
    split whose last, partial batch holds fewer records than there are replicas (the model is not defined on
    an empty batch, and TensorFlow's error for it is cut off before its cause).

    Raises:
        ConfigError: naming the batch size, the replicas and the split.
    """
    if replicas <= 1:
        return
    if batch < replicas:
        raise ConfigError(f"trainer.batch_size={batch} is smaller than the {replicas} replicas: each needs one example")
    for split, count in counts.items():
        last = count % batch
        if 0 < last < replicas:
            raise ConfigError(
                f"trainer.batch_size={batch} leaves the last batch of the {split} split ({count} records) "
                f"{last} record(s) for {replicas} replicas, so a replica would get none; choose a batch size "
                f"whose remainder on {count} records is 0 or at least {replicas}"
            )


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
