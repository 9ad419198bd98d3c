"""What goes wrong while replicas train together, as one line: a lost worker, a timed-out collective,
a check failing inside the input pipeline, a peer's own error.

    TF_CONFIG=... python run.py strategy=multi_worker strategy.heartbeat_seconds=30

A worker that stops on an error of its own (a bad file in its share, a full disk) tells
the cluster first (`errors_told_to_peers`), so its peers stop at once with its line
instead of waiting out a heartbeat or `strategy.timeout_seconds` (`trainer.distribute.watchdog`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import tensorflow as tf
from tensorflow.python.eager import context

from trainer.distribute.topology import in_multi_worker_mode
from trainer.errors import ClusterError, DataError, UserError, one_line

_PEER = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# A peer's own error, as `errors_told_to_peers` reports it to the cluster: "vggtrain worker1 stopped: <<error: ...>>"
# (TensorFlow adds its own sentences and the op's name after it).
_TOLD = re.compile(r"vggtrain (\w+?\d+) stopped: <<(.*?)>>")
# What a collective raises when a peer is gone, timed out, or reported an error to the cluster.
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective's failure (a lost or failed peer, a timeout), not this process's own."""
    if not isinstance(error, PEER_ERRORS):
        return False
    return not isinstance(error, tf.errors.InternalError) or "Collective ops is aborted" in str(error.message)


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
    text = message[at:] if at >= 0 else one_line(error)
    return re.sub(r"\s*\[\[.*", "", text)[:200]


@contextlib.contextmanager
def collective_errors(strategy: tf.distribute.Strategy, progress: Callable[[], str] | None = None) -> Iterator[None]:
    """Turns a lost worker or a collective timeout into one clear `ClusterError`, naming the worker lost and
    what `progress()` says (the epoch, the last one saved and how to resume); a check failing inside the
    input pipeline (a bad label, a corrupted record) becomes a `DataError`."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
        raise DataError(f"bad input data: {one_line(error)}") from None
    except PEER_ERRORS as error:
        message = " ".join(str(error.message).split())
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or not is_peer_failure(error):
            raise
        where = progress() if progress is not None else "restart every worker with the same command"
        if told := _TOLD.search(message):
            peer, line = told.groups()
            if peer == _own_task(strategy):  # this worker's own step watchdog: its line says what it waited for
                raise ClusterError(f"strategy=multi_worker: {line.removeprefix('error: ')}; {where}") from None
            raise ClusterError(f"strategy=multi_worker: {_address(strategy, peer)} stopped: {line}; {where}") from None
        raise ClusterError(
            f"strategy=multi_worker: {_lost_task(strategy, message)} stopped answering (no heartbeat for "
            f"strategy.heartbeat_seconds); {where}. Cause: {_cause(error, message)}"
        ) from None


def _address(strategy: tf.distribute.Strategy, task: str) -> str:
    """`worker1 at 127.0.0.1:2223` for the task named `worker1`, or the name alone."""
    found = re.fullmatch(r"(\w+?)(\d+)", task)
    return _lost_task(strategy, f"/job:{found[1]}/task:{found[2]}") if found else task


def _own_task(strategy: tf.distribute.Strategy) -> str:
    resolver = strategy.cluster_resolver
    return f"{resolver.task_type}{resolver.task_id or 0}"


@contextlib.contextmanager
def errors_told_to_peers(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """A `UserError` of this worker's own (not a lost peer's `ClusterError`) is reported to every task of the
    multi-worker cluster before it propagates: their collectives abort at once, and `collective_errors` gives
    them this worker's line. Without a coordination service the peers find out as before (a heartbeat).

    TensorFlow has no public call for this: `context.report_error_to_cluster` is what its own
    `tf.distribute.experimental.PreemptionCheckpointHandler` calls (ledger: docs/development.md, row 14)."""
    try:
        yield
    except UserError as error:
        if in_multi_worker_mode(strategy) and not isinstance(error, ClusterError):
            message = f"vggtrain {_own_task(strategy)} stopped: <<error: {one_line(error)}>>"
            try:
                context.context().report_error_to_cluster(tf.errors.ABORTED, message)
            except (ValueError, AttributeError, tf.errors.OpError):  # no coordination service (or no such call)
                pass  # the peers find out by their heartbeat, as before
        raise
