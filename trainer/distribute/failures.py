"""What goes wrong while replicas train together, as one line: a lost worker, a timed-out collective,
a check failing inside the input pipeline.

    TF_CONFIG=... python run.py strategy=multi_worker strategy.timeout_seconds=60
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import tensorflow as tf

from trainer.errors import ClusterError, DataError, op_error_reason

_PEER = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def _lost_task(strategy: tf.distribute.Strategy, message: str) -> str:
    """The other task TensorFlow's message names (`worker1 at 127.0.0.1:2223`), or `a worker`."""
    resolver = getattr(strategy, "cluster_resolver", None)
    own = (getattr(resolver, "task_type", None), str(getattr(resolver, "task_id", None)))
    for task_type, index in _PEER.findall(message):
        if (task_type, index) != own:
            try:
                address = resolver.cluster_spec().task_address(task_type, int(index))
            except (AttributeError, ValueError, KeyError):
                return f"{task_type}{index}"
            return f"{task_type}{index} at {address}"
    return "a worker"


def _cause(error: tf.errors.OpError, message: str) -> str:
    """TensorFlow's reason without the graph node's Python traceback in front of it or the node after it."""
    at = message.find("Collective ops is aborted by")
    text = message[at:] if at >= 0 else op_error_reason(error)
    return re.sub(r"\s*\[\[.*", "", text)[:200]


@contextlib.contextmanager
def collective_errors(strategy: tf.distribute.Strategy, progress: Callable[[], str] | None = None) -> Iterator[None]:
    """Turns a lost worker or a collective timeout into one clear `ClusterError`, naming the worker lost and
    what `progress()` says (the epoch, the last one saved and how to resume); a check failing inside the
    input pipeline (a bad label, a corrupted record) becomes a `DataError`."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
        raise DataError(f"bad input data: {op_error_reason(error)}") from None
    except (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.AbortedError,
        tf.errors.InternalError,
    ) as error:
        message = " ".join(str(error.message).split())
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or (
            isinstance(error, tf.errors.InternalError) and "Collective ops is aborted" not in message
        ):
            raise
        where = progress() if progress is not None else "restart every worker with the same command"
        raise ClusterError(
            f"strategy=multi_worker: {_lost_task(strategy, message)} stopped answering, or a collective waited "
            f"longer than strategy.timeout_seconds; {where}. Cause: {_cause(error, message)}"
        ) from None
