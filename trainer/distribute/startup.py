"""Before a worker joins its cluster, it waits in Python for every peer: it says whom it waits for, gives up
after `strategy.startup_timeout`, and ends at once on Ctrl-C or SIGTERM.

    TF_CONFIG=... python run.py strategy=multi_worker strategy.startup_timeout=120

`MultiWorkerMirroredStrategy()` blocks inside TensorFlow, holding the GIL, until every task has come up,
and installs TensorFlow's own SIGTERM handler there: a worker whose peer never came up waited silently
for ever, ignoring Ctrl-C and SIGTERM (only `kill -9` ended it). So each worker first listens on its own
port, to show its peers it is up, and waits until every peer's port answers: a peer still waiting the
same way, or one whose TensorFlow server runs already. Then it closes its port for TensorFlow's server
and builds the strategy, which connects at once.

A peer can still leave between its port answering and the registration with the cluster's coordination
service (the chief, worker 0 without one): a restarted worker whose chief ended just then waited an hour,
TensorFlow's default registration timeout. `register_within` bounds it by `strategy.startup_timeout` too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

from trainer.errors import ClusterError

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def listening(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at `host:port` (the peer is up)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _listen(address: str) -> socket.socket:
    """A socket listening on the port of this worker's `address`, on every interface (as TensorFlow's server).

    Raises:
        ClusterError: the port is taken (another process, or two tasks given one address) or not a port.
    """
    try:
        return socket.create_server(("", int(address.rpartition(":")[2])))
    except (OSError, ValueError) as error:
        reason = os.strerror(error.errno) if getattr(error, "errno", None) else str(error)
        raise ClusterError(
            f"strategy=multi_worker: this worker's address {address} cannot be listened on ({reason}); another "
            f"process holds the port, or two tasks of the cluster were given the same address"
        ) from None


@contextlib.contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM are noted in the list the body gets (in the main thread; elsewhere they keep their
    handlers). A handler that raised could hit the body inside a log call, which swallows it."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in SIGNALS}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_for_peers(address: str, peers: dict[str, str], timeout: float, every: float = 10.0) -> None:
    """Returns once every peer (`worker1` -> `host:port`) answers, while this worker (at `address`) answers
    theirs; logs the missing ones every `every` seconds.

    Raises:
        ClusterError: a peer is still missing after `timeout` seconds, Ctrl-C or SIGTERM arrived meanwhile, or
            this worker's port cannot be listened on.
    """
    if not peers:
        return
    started = time.monotonic()
    next_report = started + every
    missing = dict(peers)
    with _listen(address), _signals_noted() as received:
        while missing:
            missing = {name: peer for name, peer in missing.items() if not listening(peer)}
            waited = time.monotonic() - started
            if received:  # even if the last peer just came up: the user asked to stop
                waiting = _names(missing) or "the cluster to connect"
                stopped = f"stopped by {_NAMES[received[0]]}"
                raise ClusterError(f"strategy=multi_worker: {stopped} while waiting for {waiting}")
            if missing and waited > timeout:
                raise not_up(missing, timeout)
            if missing and time.monotonic() >= next_report:
                log.info("Waiting for %s (%.0f s of strategy.startup_timeout=%g)", _names(missing), waited, timeout)
                next_report += every
            if missing:
                time.sleep(0.5)


def not_up(missing: dict[str, str], timeout: float) -> ClusterError:
    """The error of a worker whose peers `missing` did not come up within `strategy.startup_timeout`."""
    return ClusterError(
        f"strategy=multi_worker: {_names(missing)} did not come up within strategy.startup_timeout={timeout:g} s; "
        "start every worker of the cluster (the same command, each with its own task index), or check the addresses"
    )


def register_within(resolver, timeout: float, heartbeat_seconds: float = 10.0) -> None:
    """Configures the coordination service as `MultiWorkerMirroredStrategy` would, with `timeout` seconds for
    every task to register instead of TensorFlow's hour (the strategy leaves a service configured before it),
    and a task that sends no heartbeat for `heartbeat_seconds` (a killed worker, a lost machine) declared dead:
    the service then aborts every other task's collectives.

    TensorFlow has no public option for it: `configure_coordination_service` is private (ledger:
    docs/development.md, row 15)."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    spec = resolver.cluster_spec()
    jobs = [name for name in ("chief", "worker") if name in spec.jobs]
    if resolver.task_type not in jobs or context.context().coordination_service is not None:
        return
    coordinated = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job)) for job in jobs]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=coordinated,
        cluster_register_timeout_in_ms=int(timeout * 1000),
        heartbeat_timeout_in_ms=int(heartbeat_seconds * 1000),
    )


def leader(peers: dict[str, str]) -> dict[str, str]:
    """The peer that hosts the coordination service, as TensorFlow picks it: the chief, else worker 0."""
    name = "chief0" if "chief0" in peers else "worker0"
    return {name: peers[name]} if name in peers else {}


def _names(peers: dict[str, str]) -> str:
    return ", ".join(f"{name} at {address}" for name, address in peers.items())
