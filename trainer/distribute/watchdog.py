"""A step that waits on its peers longer than `strategy.timeout_seconds` stops the cluster, with one line.

    TF_CONFIG=... python run.py strategy=multi_worker strategy.timeout_seconds=120

A killed worker, or one whose machine is lost, is found by the coordination service's heartbeat
(`strategy.heartbeat_seconds`, `trainer.distribute.startup.register_within`). A hung one (alive, its input
stuck on a dead mount, a deadlock) still sends heartbeats, and its peers' collectives would wait for ever.
TensorFlow's own collective timeout holds one sleeping thread per collective for the whole timeout, which
exhausted the machine's threads within minutes (ledger row 16); one thread here watches the step in flight
instead, whatever the number of collectives a step runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import keras
import tensorflow as tf

from trainer.distribute.topology import in_multi_worker_mode

log = logging.getLogger(__name__)


def _stop_cluster(message: str) -> None:
    """Aborts the collectives of every task, this one's too, with `message`: the peers' `collective_errors`
    read it as this task's own line (`failures._TOLD`)."""
    from tensorflow.python.eager import context

    try:
        context.context().report_error_to_cluster(tf.errors.DEADLINE_EXCEEDED, message)
    except (ValueError, AttributeError, tf.errors.OpError):  # no coordination service
        pass
    context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)


class StepWatchdog(keras.callbacks.Callback):
    """Times each training, validation, test and predict step (a batch, or `steps_per_execution` of them) from
    one thread; a step still running after `timeout` seconds calls `on_timeout` once with the line to give.

    Args:
        timeout: seconds a step may take, waiting on its peers included (`strategy.timeout_seconds`).
        task: this task's name for the line, `worker0`.
        on_timeout: what a late step calls with its line; by default, every task's collectives are aborted.
        every: seconds between two looks at the step in flight.
    """

    def __init__(
        self,
        timeout: float,
        task: str,
        on_timeout: Callable[[str], None] = _stop_cluster,
        every: float = 1.0,
    ):
        super().__init__()
        self.timeout, self.task, self.on_timeout, self.every = timeout, task, on_timeout, every
        self._since: float | None = None  # when the step in flight began; None between steps
        self._fired = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="vggtrain-step-watchdog", daemon=True)
        self._thread.start()

    def _begin(self, batch, logs=None) -> None:
        self._since = time.monotonic()

    def _end(self, batch, logs=None) -> None:
        self._since = None

    on_train_batch_begin = on_test_batch_begin = on_predict_batch_begin = _begin
    on_train_batch_end = on_test_batch_end = on_predict_batch_end = _end

    def _watch(self) -> None:
        while not self._closed.wait(self.every):
            since = self._since
            if since is None or self._fired or time.monotonic() - since <= self.timeout:
                continue
            self._fired = True
            waited = time.monotonic() - since
            message = (
                f"vggtrain {self.task} stopped: <<error: a step waited {waited:.0f} s for its peers, longer than "
                f"strategy.timeout_seconds={self.timeout:g}: a worker hung (its input, a deadlock) or is far slower>>"
            )
            log.warning(
                "Stopping every worker: a step has waited %.0f s <strategy.timeout_seconds=%g>", waited, self.timeout
            )
            self.on_timeout(message)

    def close(self) -> None:
        """Ends the watching thread."""
        self._closed.set()
        self._thread.join()


def step_watchdog(strategy: tf.distribute.Strategy) -> list[keras.callbacks.Callback]:
    """The callbacks a multi-worker `fit`/`evaluate` adds: the strategy's one `StepWatchdog` (one thread for
    the process), timed by `strategy.timeout_seconds`; none for any other strategy."""
    timeout = getattr(strategy, "step_timeout", None)
    if timeout is None or not in_multi_worker_mode(strategy):
        return []
    if getattr(strategy, "step_watchdog", None) is None:
        resolver = strategy.cluster_resolver
        strategy.step_watchdog = StepWatchdog(timeout, f"{resolver.task_type}{resolver.task_id or 0}")
    return [strategy.step_watchdog]
