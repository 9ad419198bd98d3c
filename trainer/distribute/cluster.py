"""Who am I in a multi-worker cluster? Read from TF_CONFIG, `strategy.workers`, SkyPilot or Slurm, without TensorFlow.

Hydra needs the answer before it creates the run folder, so only the chief
writes to `outputs/`; the other workers get a temporary folder (see the
`worker_dir` resolver in `trainer.config.resolvers`). `is_chief_task` is the one rule for
"who is the chief", used here and for a running strategy (`trainer.distribute.strategies`).

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 1}}' \\
        python run.py strategy=multi_worker
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from trainer.distribute import hosts as launched
from trainer.errors import ConfigError

# Where `strategy.cluster=auto` looks, in this order. SkyPilot before Slurm: its variables name the job the user
# launched, even where SkyPilot itself runs on a Slurm cluster.
AUTO_ORDER = ("tf_config", "workers", "skypilot", "slurm")
CLUSTER_SOURCES = ("auto", *AUTO_ORDER)
WORKER_PREFIX = "vggtrain-worker-"  # temporary folders of non-chief workers, removed when they finish


def is_chief_task(task_type: str | None, task_index: int, cluster_has_chief: bool) -> bool:
    """The chief writes the outputs: task `chief`, or worker 0 when the cluster names no chief task
    (TensorFlow's own rule); a process outside any cluster (no task type) is its own chief."""
    if not task_type:
        return True
    return task_type == "chief" or (task_type == "worker" and task_index == 0 and not cluster_has_chief)


def count_workers(cluster: dict[str, list]) -> int:
    """The processes that train in a cluster spec (`chief` and `worker` tasks); 1 for an empty spec."""
    return max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", [])))


@dataclass(frozen=True)
class Role:
    task_type: str
    task_index: int
    num_workers: int
    source: str  # where the cluster came from: tf_config | workers | skypilot | slurm | local
    cluster_has_chief: bool = False
    hosts: tuple[str, ...] = ()  # skypilot, slurm: each task's host in rank order (ports: `hosts.on_ports`)

    @property
    def is_chief(self) -> bool:
        return is_chief_task(self.task_type, self.task_index, self.cluster_has_chief)

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == EVALUATOR


TRAINING_TASKS = ("chief", "worker")  # the task types MultiWorkerMirroredStrategy trains on
EVALUATOR = "evaluator"  # TFJob's and Vertex AI's task beside training: it watches the run (trainer.tasks.watch)


def check_cluster(cluster: dict[str, list], task_type: str, index: int, source: str = "TF_CONFIG") -> None:
    """Refuses, in one line, a cluster TensorFlow would reject late or hang on: a role it does not know (Kubeflow's
    `master`), a role this trainer does not run (`ps`), the task outside the cluster, two tasks on one address.
    An `evaluator` task (listed in the cluster or not, as managers differ) trains nothing: it watches the run.

    Raises:
        ConfigError: naming the task or the address.
    """
    for role in cluster:
        if role == "master":
            raise ConfigError(
                f"{source}: the task type 'master' is not one TensorFlow knows; name it 'chief' (in a Kubeflow "
                f"TFJob, the replica type Chief)"
            )
        if role not in (*TRAINING_TASKS, EVALUATOR):
            raise ConfigError(
                f"{source}: the cluster has '{role}' tasks; MultiWorkerMirroredStrategy trains on "
                f"{' and '.join(TRAINING_TASKS)} tasks only (no parameter servers), beside one {EVALUATOR}"
            )
    if task_type not in (*TRAINING_TASKS, EVALUATOR):
        raise ConfigError(
            f"{source}: this task's type is {task_type!r}; expected one of {[*TRAINING_TASKS, EVALUATOR]}"
        )
    if task_type == EVALUATOR:
        if index != 0:
            raise ConfigError(f"{source}: this task is {EVALUATOR} {index}; a cluster has one {EVALUATOR}, index 0")
    elif not 0 <= index < len(cluster.get(task_type, [])):
        raise ConfigError(
            f"{source}: this task is {task_type} {index}, outside the cluster's {len(cluster.get(task_type, []))} "
            f"{task_type} address(es)"
        )
    seen: dict[str, str] = {}
    for role in TRAINING_TASKS:
        for position, address in enumerate(cluster.get(role, [])):
            if address in seen:
                raise ConfigError(f"{source}: {seen[address]} and {role}{position} have the same address {address}")
            seen[address] = f"{role}{position}"


def _from_tf_config(text: str) -> Role:
    try:
        spec = json.loads(text)
        task = spec["task"]
        cluster = {role: list(addresses) for role, addresses in spec["cluster"].items()}
        task_type, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        reason = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise ConfigError(f"TF_CONFIG must be JSON with 'cluster' and 'task' (type, index); {reason}") from None
    check_cluster(cluster, task_type, index)
    return Role(task_type, index, count_workers(cluster), "tf_config", bool(cluster.get("chief")))


VERTEX_POOLS = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps", "workerpool3": EVALUATOR}


def tf_config_of_cluster_spec(text: str) -> str:
    """The TF_CONFIG that Vertex AI's `CLUSTER_SPEC` describes: worker pool 0 is the chief, 1 the workers, 2 the
    parameter servers (refused later, as in TF_CONFIG), 3 the evaluator, which is no member of the cluster.

    Raises:
        ConfigError: it is not JSON with 'cluster' and 'task', or names a pool Vertex AI has not.
    """
    try:
        spec = json.loads(text)
        pools, task = spec["cluster"], spec["task"]
        unknown = sorted(set(pools) - set(VERTEX_POOLS)) + ([] if task["type"] in VERTEX_POOLS else [task["type"]])
        index = int(task["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        reason = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise ConfigError(f"CLUSTER_SPEC must be JSON with 'cluster' and 'task' (type, index); {reason}") from None
    if unknown:
        raise ConfigError(f"CLUSTER_SPEC: unknown worker pool {unknown[0]!r}; Vertex AI has {list(VERTEX_POOLS)}")
    cluster = {VERTEX_POOLS[pool]: list(addresses) for pool, addresses in pools.items() if pool != "workerpool3"}
    return json.dumps({"cluster": cluster, "task": {"type": VERTEX_POOLS[task["type"]], "index": index}})


def _tf_config_text() -> str | None:
    """TF_CONFIG, or where it is absent the one Vertex AI's CLUSTER_SPEC describes; None without either."""
    if os.environ.get("TF_CONFIG"):
        return os.environ["TF_CONFIG"]
    return tf_config_of_cluster_spec(os.environ["CLUSTER_SPEC"]) if os.environ.get("CLUSTER_SPEC") else None


def may_be_chief(task_index: str | None) -> bool:
    """Whether this process can be the chief, as far as the environment (and a `strategy.task_index=` given on
    the command line) tells before the config is composed: a TF_CONFIG, SkyPilot or Slurm task other than the
    chief, or a task index above 0, is not. Settings that do not parse are left to the run's own one-line check."""
    try:
        text = _tf_config_text()
        if text:
            return _from_tf_config(text).is_chief
    except ConfigError:
        return True
    if task_index not in (None, "0"):
        return False
    if "SKYPILOT_NODE_IPS" in os.environ:
        return os.environ.get("SKYPILOT_NODE_RANK", "0").strip() in ("0", "")
    return os.environ.get("SLURM_PROCID", "0") == "0"


def _from_tf_config_variable() -> Role | None:
    if text := _tf_config_text():
        os.environ["TF_CONFIG"] = text  # from CLUSTER_SPEC alone: TensorFlow's own resolver reads it too
        return _from_tf_config(text)
    return None


def _from_workers(workers: list[str] | None, task_index: int | None) -> Role | None:
    if not workers:
        return None
    if task_index is None or not 0 <= task_index < len(workers):
        raise ConfigError(f"strategy.task_index must be in [0, {len(workers)}) with strategy.workers; got {task_index}")
    check_cluster({"worker": list(workers)}, "worker", task_index, "strategy.workers")
    return Role("worker", task_index, len(workers), "workers")


def _from_launcher(source: str, tasks: launched.Tasks | None) -> Role | None:
    """Slurm's and SkyPilot's tasks are all workers; rank 0 is the chief."""
    if tasks is None:
        return None
    return Role("worker", tasks.rank, len(tasks.hosts), source, hosts=tasks.hosts)


# What each source reads, for the line that says it is missing.
NEEDS = {
    "tf_config": "TF_CONFIG (or Vertex AI's CLUSTER_SPEC) is not set",
    "workers": "strategy.workers is not set",
    "skypilot": "SKYPILOT_NODE_IPS is not set (run the command in a SkyPilot task's run: section)",
    "slurm": "SLURM_PROCID is not set (start the tasks with srun)",
}


def worker_role(source: str, workers: list[str] | None, task_index: int | None) -> Role:
    """This process's role, from the cluster `source` (auto tries each of `AUTO_ORDER` in turn).

    Raises:
        ConfigError: the chosen source is not set up, or its settings are bad (one line naming the variable).
    """
    if source not in CLUSTER_SOURCES:
        raise ConfigError(f"strategy.cluster must be one of {list(CLUSTER_SOURCES)}; got {source!r}")
    readers = {
        "tf_config": _from_tf_config_variable,
        "workers": lambda: _from_workers(workers, task_index),
        "skypilot": lambda: _from_launcher("skypilot", launched.skypilot_tasks()),
        "slurm": lambda: _from_launcher("slurm", launched.slurm_tasks()),
    }
    for name in AUTO_ORDER if source == "auto" else (source,):
        if role := readers[name]():
            return role
    if source == "auto":
        return Role("worker", 0, 1, "local")  # a cluster of one: this process is the chief
    raise ConfigError(f"strategy.cluster={source} but {NEEDS[source]}")
