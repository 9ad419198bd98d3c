"""The soak rows: two multi-worker processes on 127.0.0.1 train for thousands of steps with the same threads and memory.

    python -m benchmarks --only soak

Two `python run.py strategy=multi_worker` workers train the digits demo's VGG19 at a
sixteenth of its width (16 synchronized batch-norm layers, three all-reduces each a step)
for 2,000 steps (`--quick`: 400), validating every epoch. Each worker's thread count and
resident memory are read from `/proc/PID/status` as each epoch ends, and the threads
once a second for the peak. The rows compare the sample taken as the last epoch ended
with the one taken as epoch 1 ended: the baseline is the run itself after its start-up.
With TensorFlow's collective timeout (600 s, the old default) the same run went from 560
to 15,144 threads within 30 s of epoch 1's end, and died of the machine's process limit
in epoch 2.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import ROOT, Row

STEPS = {True: (4, 100), False: (10, 200)}  # (epochs, steps per epoch) per mode (quick: True)
TARGET = 1.2  # the end's threads and memory, at most 1.2x epoch 1's (issue 54)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _status(pid: int) -> tuple[int, int] | None:
    """(threads, resident KiB) of a live process, from /proc; None once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if "VmRSS" not in fields:  # exited, not yet reaped
        return None
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def _worker(index: int, ports: list[int], folder: Path, overrides: list[str]) -> subprocess.Popen:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    command = [sys.executable, str(ROOT / "run.py"), "strategy=multi_worker", *overrides]
    return subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def soak(folder: Path, quick: bool) -> list[Row]:
    epochs, steps = STEPS[quick]
    overrides = [
        "model.width_multiplier=0.0625",
        "trainer.batch_size=32",
        f"trainer.epochs={epochs}",
        f"trainer.steps_per_epoch={steps}",
        "trainer.verbose=0",
    ]
    ports = _free_ports(2)
    workers = [_worker(index, ports, folder, overrides) for index in range(2)]
    at_epoch_end: list[list[tuple[int, int]]] = [[], []]  # (threads, KiB) as each epoch's line is printed
    peak = [0, 0]  # the most threads of any sample, once a second
    outputs: list[list[str]] = [[], []]

    def read(index: int) -> None:
        for line in workers[index].stdout:
            outputs[index].append(line)
            if re.search(r"Epoch \d+/\d+:", line) and (status := _status(workers[index].pid)):
                at_epoch_end[index].append(status)

    readers = [threading.Thread(target=read, args=(index,), daemon=True) for index in range(2)]
    for reader in readers:
        reader.start()
    while any(worker.poll() is None for worker in workers):
        for index, worker in enumerate(workers):
            if status := _status(worker.pid):
                peak[index] = max(peak[index], status[0])
        time.sleep(1.0)
    for reader in readers:
        reader.join()
    codes = [worker.returncode for worker in workers]
    if codes != [0, 0] or any(len(samples) != epochs for samples in at_epoch_end):
        raise RuntimeError(f"the soak run failed: exit codes {codes}\n{''.join(outputs[0][-30:])}")
    name = f"2 workers x {epochs * steps:,} steps (VGG19/16 on digits, validation every epoch)"
    rows = []
    for index, samples in enumerate(at_epoch_end):
        (first_threads, first_memory), (last_threads, last_memory) = samples[0], samples[-1]
        worker = f"{name}: worker {index}'s"
        rows += [
            Row(f"{worker} threads, last epoch / epoch 1", last_threads, first_threads, "threads", TARGET, False),
            Row(f"{worker} peak threads / epoch 1", peak[index], first_threads, "threads", None, False),
            Row(
                f"{worker} memory, last epoch / epoch 1", last_memory / 1024, first_memory / 1024, "MiB", TARGET, False
            ),
        ]
    return rows
