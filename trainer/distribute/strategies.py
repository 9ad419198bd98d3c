"""The strategies `strategy=single|mirrored|multi_worker` name: each YAML option's `_target_` is a builder here.

    python run.py strategy=mirrored strategy.cpu_devices=2    # 2 logical CPUs: the multi-device path, on CPU
    TF_CONFIG=... python run.py strategy=multi_worker

The task code only sees a `tf.distribute.Strategy`, its replica count, its
input pipelines and whether this process is the chief; everything here reads
TensorFlow's public API (the Keras multi-worker workaround is `trainer.distribute.compat`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from trainer.distribute import cluster as roles
from trainer.distribute import hosts
from trainer.distribute.topology import in_multi_worker_mode
from trainer.errors import ConfigError

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


def _resolver(source: str, workers: list[str] | None, task_index: int | None, slurm_port_base: int = 8888):
    """TensorFlow's view of the cluster: TF_CONFIG's own resolver (a single local worker without it), else a fixed
    cluster of workers: `workers`, or the hosts SkyPilot or Slurm give (`trainer.distribute.hosts`), whose tasks
    listen on `slurm_port_base` and up.

    Slurm's hostlist is expanded here, not by TensorFlow's `SlurmClusterResolver`: its parser takes one range at a
    name's end (`n[1-2]-ib` failed), it counts GPUs with nvidia-smi (missing on a CPU node), and it told the
    strategy one GPU per task. Every GPU this process sees is its own: run one task per node, or let Slurm bind
    GPUs to tasks (CUDA_VISIBLE_DEVICES).
    """
    role = roles.worker_role(source, workers, task_index)  # validates the settings first
    resolvers = tf.distribute.cluster_resolver
    if role.source in ("tf_config", "local"):
        return resolvers.TFConfigClusterResolver()
    addresses = list(workers) if role.source == "workers" else hosts.on_ports(role.hosts, slurm_port_base)
    # A resolver other than TF_CONFIG's is asked for the GPUs to mirror over: without an answer, none (the CPU).
    gpus = len(tf.config.list_physical_devices("GPU"))
    spec = tf.train.ClusterSpec({"worker": addresses})
    return resolvers.SimpleClusterResolver(
        spec, task_type="worker", task_id=role.task_index, num_accelerators={"GPU": gpus}, rpc_layer="grpc"
    )


def _addresses(resolver) -> tuple[str | None, dict[str, str]]:
    """(this task's address, every other training task of the cluster (`worker1`) and its address)."""
    spec, own = resolver.cluster_spec().as_dict(), (resolver.task_type, resolver.task_id)
    tasks = {
        (task_type, index): address
        for task_type in ("chief", "worker")
        for index, address in enumerate(spec.get(task_type, []))
    }
    address = tasks.pop(own, None)
    return address, {f"{task_type}{index}": peer for (task_type, index), peer in tasks.items()}


def multi_worker(
    cluster: str = "auto",
    workers: list[str] | None = None,
    task_index: int | None = None,
    timeout_seconds: float = 600.0,
    heartbeat_seconds: float = 10.0,
    startup_timeout: float = 600.0,
    slurm_port_base: int = 8888,
) -> tf.distribute.Strategy:
    """`MultiWorkerMirroredStrategy` over the cluster from TF_CONFIG, `workers` + `task_index`, SkyPilot or Slurm.

    Until every worker is up, this one logs whom it waits for every 10 s and stops after `startup_timeout`
    seconds, or at once on Ctrl-C or SIGTERM (`trainer.distribute.startup`). Then a worker that sends no
    heartbeat for `heartbeat_seconds` (killed, its machine lost) stops its peers, and a step that waits longer
    than `timeout_seconds` (a peer hung) stops the cluster (`trainer.distribute.watchdog`).

    No collective gets a timeout of its own: TensorFlow holds one sleeping thread per collective for its whole
    timeout, so a timeout of minutes piled up thousands of threads a minute until the machine's process limit
    killed the run (docs/development.md, ledger row 16). The gradients already go in one all-reduce a step
    (`CommunicationOptions.bytes_per_pack=0`, TensorFlow's default, packs them all into one); most of a
    batch-norm model's collectives are its synchronized batch norm's (three per layer per step).
    """
    from trainer.distribute import compat, fused_moments, startup

    compat.apply()
    fused_moments.apply()  # each collective leaks upstream: a third of batch norm's (ledger row 17)
    options = tf.distribute.experimental.CommunicationOptions()
    resolver = _resolver(cluster, workers, task_index, slurm_port_base)
    address, peers = _addresses(resolver)
    if address is not None:
        startup.wait_for_peers(address, peers, startup_timeout)
        startup.register_within(resolver, startup_timeout, heartbeat_seconds)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    except tf.errors.OpError as error:  # a peer left while the cluster connected
        log.debug("The cluster did not connect: %s", error)
        gone = {name: peer for name, peer in peers.items() if not startup.listening(peer)}
        raise startup.not_up(gone or startup.leader(peers) or peers, startup_timeout) from None
    strategy.step_timeout = timeout_seconds  # read by the step watchdog (trainer.distribute.watchdog)
    return strategy


def describe(strategy: tf.distribute.Strategy, name: str) -> None:
    """Logs which strategy runs and on how many replicas."""
    kind = "TensorFlow's default strategy" if strategy is tf.distribute.get_strategy() else type(strategy).__name__
    log.info("Strategy %s with %d replica(s) <strategy=%s>", kind, strategy.num_replicas_in_sync, name)


def distribute_training_data(
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
