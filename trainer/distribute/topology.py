"""Where this process stands in a built strategy: whether it is the chief, how many input pipelines feed it.

    python run.py strategy=multi_worker      # TF_CONFIG's chief (or worker 0) writes the run's outputs

Read from the strategy itself (its cluster resolver), so any strategy answers: outside
multi-worker training this process is the chief and one pipeline feeds every replica.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.distribute import cluster as roles


def _cluster(strategy: tf.distribute.Strategy) -> tuple[object | None, dict[str, list]]:
    """(cluster resolver, cluster spec as a dict) of a multi-worker strategy; (None, {}) for any other."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return None, {}
    return resolver, resolver.cluster_spec().as_dict()


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's outputs (always, outside multi-worker runs)."""
    resolver, spec = _cluster(strategy)
    if resolver is None:
        return True
    return roles.is_chief_task(resolver.task_type, resolver.task_id or 0, "chief" in spec)


def num_input_pipelines(strategy: tf.distribute.Strategy) -> int:
    """The input pipelines `distribute_datasets_from_function` builds: one per worker process under
    multi-worker training, else 1 (one pipeline feeds every replica of this machine)."""
    return roles.count_workers(_cluster(strategy)[1])


def in_multi_worker_mode(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` spans several worker processes (a one-worker `multi_worker` run does not)."""
    return num_input_pipelines(strategy) > 1
