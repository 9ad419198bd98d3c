"""Distribution strategies by name: `strategy=single|mirrored|multi_worker` builds a `tf.distribute.Strategy`.

    python run.py strategy=mirrored strategy.cpu_devices=2    # 2 logical CPUs: the multi-device path, on CPU
    TF_CONFIG=... python run.py strategy=multi_worker

The task code only sees a `tf.distribute.Strategy`, its replica count and
whether this process is the chief.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from trainer import cluster
from trainer.errors import ClusterError, ConfigError, DataError

log = logging.getLogger(__name__)


def split_cpu(num_devices: int) -> list[str]:
    """Splits the CPU into `num_devices` logical devices; must run before TensorFlow starts its runtime."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:
            raise ConfigError(
                f"strategy.cpu_devices={num_devices} must be set before TensorFlow starts; "
                "it already runs with another device layout"
            ) from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def single(device: str | None = None) -> tf.distribute.Strategy:
    """One device: `device` if given (a `OneDeviceStrategy`), else TensorFlow's default strategy, which runs
    on the first GPU if there is one, else on the CPU.

    The default strategy distributes nothing, and costs nothing: a `OneDeviceStrategy("/cpu:0")` made each
    VGG19 step of the digits demo 2.3x slower on this project's 2-core CPU (0.5 s against 0.22 s), and
    under any real strategy Keras's `jit_compile="auto"` turns XLA off, where here it picks XLA on a GPU.
    """
    if device is None:
        return tf.distribute.get_strategy()
    return tf.distribute.OneDeviceStrategy(device)


def mirrored(devices: list[str] | None = None, cpu_devices: int = 0) -> tf.distribute.Strategy:
    """Synchronous data parallelism on one machine: `devices`, else N logical CPUs, else all GPUs."""
    if cpu_devices:
        devices = split_cpu(cpu_devices)
    return tf.distribute.MirroredStrategy(devices=list(devices) if devices else None)


def _resolver(source: str, workers: list[str] | None, task_index: int | None):
    role = cluster.worker_role(source, workers, task_index)  # validates the settings first
    resolvers = tf.distribute.cluster_resolver
    if role.source == "workers":
        spec = tf.train.ClusterSpec({"worker": list(workers)})
        return resolvers.SimpleClusterResolver(spec, task_type="worker", task_id=task_index, rpc_layer="grpc")
    if role.source == "slurm":
        return resolvers.SlurmClusterResolver()
    return resolvers.TFConfigClusterResolver()  # TF_CONFIG, or a single local worker without it


def multi_worker(
    cluster: str = "auto",
    workers: list[str] | None = None,
    task_index: int | None = None,
    timeout_seconds: float = 600.0,
) -> tf.distribute.Strategy:
    """`MultiWorkerMirroredStrategy` over the cluster from TF_CONFIG, `workers` + `task_index`, or Slurm.

    A collective that waits longer than `timeout_seconds` (a worker died) fails instead of hanging.
    """
    from trainer import compat

    compat.apply()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=_resolver(cluster, workers, task_index),
        communication_options=options,
    )


STRATEGIES: dict[str, Callable[..., tf.distribute.Strategy]] = {
    "single": single,
    "mirrored": mirrored,
    "multi_worker": multi_worker,
}


def build_strategy(name: str, **options) -> tf.distribute.Strategy:
    """Builds the strategy `name` with its own options.

    Raises:
        ConfigError: `name` is not a known strategy.
    """
    if name not in STRATEGIES:
        raise ConfigError(f"strategy.name must be one of {sorted(STRATEGIES)}; got {name!r}")
    strategy = STRATEGIES[name](**options)
    kind = "TensorFlow's default strategy" if strategy is tf.distribute.get_strategy() else type(strategy).__name__
    log.info("Strategy %s with %d replica(s) <strategy=%s>", kind, strategy.num_replicas_in_sync, name)
    return strategy


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's outputs (always, outside multi-worker runs)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return True
    if not resolver.task_type:
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief)


def worker_name(strategy: tf.distribute.Strategy) -> str:
    """This process's task in the cluster, e.g. `worker1` (`worker0` outside multi-worker runs)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return "worker0"
    return f"{resolver.task_type}{resolver.task_id}"


def error_reason(error: tf.errors.OpError) -> str:
    """The useful part of a TensorFlow error: the text of our pipeline's assertions or of the ValueError
    of a Python step, else the first 300 characters."""
    match = re.search(r"assertion failed: \[([^\]]+)\]", error.message) or re.search(
        r"ValueError: ([^\n]+)", error.message
    )
    if match:
        return match.group(1)
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:.*", "", error.message)  # TensorFlow's op plumbing
    text = " ".join(text.split())[:300]
    if isinstance(error, tf.errors.DataLossError) and text.startswith("corrupted record at"):
        text += " in a TFRecord file (without a manifest.json beside them, every file is checked at start-up and named)"
    return text


@contextlib.contextmanager
def collective_errors(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Turns a lost worker or a collective timeout into one clear `ClusterError`, and a check failing
    inside the input pipeline (a bad label, a corrupted record) into a `DataError`."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
        raise DataError(f"bad input data: {error_reason(error)}") from None
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as error:
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise
        reason = " ".join(str(error.message).split())[:300]
        raise ClusterError(
            f"strategy=multi_worker: a worker stopped responding or a collective timed out "
            f"(strategy.timeout_seconds); restart every worker with the same command. Cause: {reason}"
        ) from None


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` spans several worker processes (a one-worker `multi_worker` run does not)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.extended._in_multi_worker_mode()


def num_input_pipelines(strategy: tf.distribute.Strategy) -> int:
    """The input pipelines `distribute_datasets_from_function` builds: one per worker under multi-worker
    training, else 1 (one pipeline feeds every replica of this machine)."""
    return strategy.extended._num_workers if in_multi_worker_mode(strategy) else 1


def training_input(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    for_worker: Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None,
):
    """The training input for `fit`: under multi-worker training, each worker's own pipeline, built by
    `for_worker` from its `InputContext` (`distribute_datasets_from_function`), so a worker reads only its
    share; otherwise `dataset`, one pipeline feeding every replica of this machine."""
    if for_worker is None or not in_multi_worker_mode(strategy):
        return dataset
    return strategy.distribute_datasets_from_function(for_worker)


def per_replica_batch(global_batch: int, strategy: tf.distribute.Strategy) -> int:
    """The batch each replica sees; the global batch must split evenly.

    Raises:
        ConfigError: `global_batch` is not divisible by the number of replicas.
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch % replicas:
        raise ConfigError(
            f"trainer.batch_size={global_batch} must be divisible by the {replicas} replicas of the strategy"
        )
    return global_batch // replicas
