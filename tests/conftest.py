"""Shared fixtures: the real config composed with Hydra, tiny datasets made on the fly, `run.py` run in this
process, and one tiny trained run shared by every test that evaluates, predicts or exports.

Tiers (markers): `unit` (a function or class), `integration` (a task or pipeline end to end, in process),
`e2e` (a real process: `python run.py`, kills, workers, locks, sweeps, console output) and `slow` (left
out of the default run: `pytest -m slow`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _own_cache_home() -> None:
    """The suite's caches (the folder check's verdicts, decoded images) in a temporary folder, not the user's
    `~/.cache/vggtrain`: a test must not find what another run kept, nor leave anything behind. Matplotlib keeps
    its own font cache where it was (rebuilding it costs seconds per process)."""
    import atexit
    import shutil
    import tempfile

    real = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(real, "matplotlib"))
    home = tempfile.mkdtemp(prefix="vggtrain-tests-cache-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["XDG_CACHE_HOME"] = home


_own_cache_home()

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CIFAR_TRAIN = [f"data_batch_{index}.bin" for index in range(1, 6)]
LOGICAL_CPUS = 2  # `strategy=mirrored strategy.cpu_devices=2` runs in this process on these


def _split_cpu() -> None:
    """Two logical CPU devices, made once before TensorFlow's runtime starts, so that the mirrored strategy
    runs in process as `strategy.cpu_devices=2` would make it."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)


_split_cpu()


@pytest.fixture(autouse=True)
def _one_run_leaves_no_global_state():
    """TensorFlow's op determinism and Keras's precision policy are process-wide: one test's run must not
    leave them to the next (a real `python run.py` starts without them)."""
    yield
    import keras
    from tensorflow.python.framework import config as tf_config  # the only switch back; tests may use it

    from trainer.tasks import runtime

    tf_config.disable_op_determinism()
    runtime._determinism["on"] = False
    keras.mixed_precision.set_global_policy("float32")


@dataclass
class CliResult:
    """What `python run.py ARGS` would have returned and printed."""

    returncode: int
    stdout: str
    stderr: str
    value: float | None = None  # what the task returned (the objective of a training run)


def run_cli(arguments: list[str], cwd: Path | None = None) -> CliResult:
    """`python run.py ARGUMENTS` in this process, as a user types it: Hydra composes, runs the task, and a bad
    input ends in one `error: ...` line on stderr and exit code 1. Hydra's global state and its log handlers
    are cleared afterwards; `SystemExit` is caught. Costs a fraction of a subprocess (no TensorFlow import)."""
    from absl import logging as absl_logging
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    import run as entry

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # A logging config with disable_existing_loggers (hydra/job_logging=disabled) disables every logger made so
    # far: re-enabled afterwards, or a later test's caplog on this worker sees nothing of them.
    enabled = [one for one in logging.Logger.manager.loggerDict.values() if isinstance(one, logging.Logger)]
    enabled = [one for one in enabled if not one.disabled]
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    # Hydra's logging set-up (dictConfig) closes every handler made so far. absl's handler closes its stream
    # unless it is the current sys.stderr: pointed at the redirected stream, it leaves pytest's alone.
    absl_handler = absl_logging.get_absl_handler().python_handler
    absl_stream = absl_handler.stream
    GlobalHydra.instance().clear()
    result = CliResult(0, "", "")
    try:
        os.chdir(cwd or previous)
        absl_handler.stream = err
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                result.value = entry.cli(list(arguments), exit_hard_on_disk_error=False)
            except SystemExit as exit_:
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
                result.returncode = 1 if isinstance(exit_.code, str) else int(exit_.code or 0)
    finally:
        absl_handler.stream = absl_stream
        os.chdir(previous)
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for one in enabled:
            one.disabled = False
    result.stdout, result.stderr = out.getvalue(), err.getvalue()
    return result


def compose(overrides: list[str], output_dir: Path | str = "unused"):
    """The composed config, as `python run.py OVERRIDES` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=[*overrides, f"output_dir={output_dir}"])


def pattern_records(labels: np.ndarray, first_index: int = 0, size: int = 32, channels: int = 3) -> bytes:
    """CIFAR-layout records whose pixels carry their own label and index.

    Channel-first planes: R is `label * 20` everywhere, G is `index % 256`,
    B is `index // 256`; the top-left pixel of R is 255 so an HWC/CHW mix-up shows.
    """
    count = len(labels)
    planes = np.zeros((count, channels, size, size), dtype=np.uint8)
    index = np.arange(first_index, first_index + count)
    planes[:, 0] = (labels * 20)[:, None, None]
    if channels == 3:
        planes[:, 1] = (index % 256)[:, None, None]
        planes[:, 2] = (index // 256)[:, None, None]
    return np.concatenate([labels[:, None].astype(np.uint8), planes.reshape(count, -1)], axis=1).tobytes()


def write_cifar(folder: Path, records_per_file: int = 16, num_test: int = 16, seed: int = 0) -> Path:
    """Writes tiny CIFAR-10 binary files (pattern images, labels 0..9) into `folder`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    index = 0
    for name in CIFAR_TRAIN:
        labels = rng.integers(0, 10, records_per_file)
        (folder / name).write_bytes(pattern_records(labels, index))
        index += records_per_file
    (folder / "test_batch.bin").write_bytes(pattern_records(rng.integers(0, 10, num_test), index))
    return folder


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    return write_cifar(tmp_path / "cifar")


def cifar_overrides(data_dir: Path) -> list[str]:
    """Overrides that make `dataset=cifar` fit the tiny files of `write_cifar`."""
    return [
        "dataset=cifar",
        f"dataset.data_dir={data_dir}",
        "dataset.val_size=16",
        "debug=smoke",
        "trainer.batch_size=8",
        "trainer.steps_per_epoch=2",
    ]


def tfrecord_parts(files, spec, labeled: bool = True, num_classes: int | None = 2, shares=None):
    """(Source, decoder) of TFRecord `files` (or of one worker's `shares`, a `Records`) as `dataset=cats_dogs`
    builds them, for the one pipeline (`trainer.data.pipeline`)."""
    from trainer.data import tfrecords
    from trainer.data.decoders import TFRecordDecoder
    from trainer.data.shares import Records
    from trainer.data.sources import Source, TFRecordReader

    paths = [str(file) for file in files]
    if shares is None:
        shares = Records.whole_files(paths, sum(tfrecords.scan_records(path, spec) for path in paths))
    reader = TFRecordReader(tfrecords.compression_of(paths, spec.compression))
    return Source(shares, reader), TFRecordDecoder(spec, num_classes if labeled else None, labeled)


def binary_parts(files, layout, records=None, num_classes: int | None = None):
    """(Source, decoder) of fixed-length record `files` (whole, or the given `Records`), as `dataset=cifar` has."""
    from trainer.data import binary
    from trainer.data.decoders import BinaryDecoder
    from trainer.data.shares import Records
    from trainer.data.sources import FixedLengthReader, Source

    paths = [str(file) for file in files]
    if records is None:
        records = Records.whole_files(paths, sum(binary.records_by_size(path, layout) for path in paths))
    return Source(records, FixedLengthReader(layout.record_bytes)), BinaryDecoder(layout, num_classes)


TINY_MODEL = ["model=custom", "model._target_=tiny_model.build", "trainer.verbose=0"]  # tests/tiny_model.py


def tiny_overrides(data_dir: Path) -> list[str]:
    """`cifar_overrides` with a three-layer network (tests/tiny_model.py) instead of VGG19, for the tests of the
    run machinery (kills, resumes, sweeps, workers, trackers, callbacks) where the model is not the point; nor is
    the evaluation report (tests/test_report.py and the tracker tests have it)."""
    overrides = [item for item in cifar_overrides(data_dir) if item != "debug=smoke"]  # smoke sets VGG19 keys
    return [*overrides, *TINY_MODEL, "trainer.epochs=1", "evaluate.report=false"]


# A real process sees what `pytest` sees: the project, and tests/ (tiny_model.py).
SUBPROCESS_ENV = {
    **os.environ,
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
}


def run_py(args: list[str], cwd: Path = ROOT, timeout: int = 600):
    """`python run.py ARGS` in a subprocess, as a user types it; returns the CompletedProcess (text output)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_ports(count: int) -> list[int]:
    """`count` ports of 127.0.0.1 that are free now (the system picks them; none is held after)."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive free ports on 127.0.0.1 (Slurm's and SkyPilot's tasks count up from a base)."""
    for _ in range(50):
        base = free_ports(1)[0]
        try:
            sockets = [socket.create_server(("127.0.0.1", base + offset)) for offset in range(count)]
        except OSError:
            continue
        for sock in sockets:
            sock.close()
        return base
    raise AssertionError("no consecutive free ports")


def tf_config(ports: list[int], index: int) -> str:
    """TF_CONFIG of worker `index` in a cluster of one worker per port of `ports`, all on 127.0.0.1."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def launch_workers(
    arguments: list[str],
    cwd: Path,
    ports: list[int] | None = None,
    indices: Sequence[int] = (0, 1),
    env: dict[str, str] | None = None,
    per_worker: Callable[[int], tuple[list[str], dict[str, str]]] | None = None,
) -> list[subprocess.Popen]:
    """`python run.py ARGUMENTS` started as the workers `indices` of a cluster on 127.0.0.1 with one worker per
    port of `ports` (two free ones unless given): each gets its TF_CONFIG on top of `env` (os.environ unless
    given), and `per_worker(index)` may add (arguments, environment variables) of its own, after the common ones.
    Each process's stdout is a pipe, stderr merged into it, in text mode."""
    ports = ports or free_ports(2)
    processes = []
    for index in indices:
        own_arguments, own_env = per_worker(index) if per_worker else ([], {})
        worker_env = {**(os.environ if env is None else env), "TF_CONFIG": tf_config(ports, index), **own_env}
        processes.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "run.py"), *arguments, *own_arguments],
                cwd=cwd,
                env=worker_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return processes


def csv_rows(path: Path | str) -> list[dict[str, str]]:
    """The rows of a CSV file with a header (history.csv, eval_history.csv, summary.csv, predictions, ...), as
    strings, read here rather than by the trainer's own reader."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def check_run_metrics(run_dir: Path, mode: str = "max") -> dict:
    """Cross-checks a finished run's files, so that a run writing wrong figures fails where a bare
    `0 <= accuracy <= 1` would pass: the objective is the best `objective.metric` of history.csv and
    the val figures are that epoch's; test accuracy is the confusion matrix's diagonal over its total;
    the losses are finite. Returns metrics.json."""
    import math

    metrics = json.loads((run_dir / "metrics.json").read_text())
    history = csv_rows(run_dir / "history.csv")
    values = [float(row[metrics["objective_metric"]]) for row in history]
    best = (max if mode == "max" else min)(values)
    assert metrics["objective"] == pytest.approx(best, abs=1e-6)
    assert len(history) == metrics["epochs_completed"]
    best_row = history[metrics["best_epoch"] - 1]
    assert float(best_row[metrics["objective_metric"]]) == pytest.approx(best, abs=1e-6)
    assert metrics["val_accuracy"] == pytest.approx(float(best_row["val_accuracy"]), abs=1e-6)
    with open(run_dir / "confusion_matrix_test.csv", newline="") as handle:
        counts = np.array([[int(cell) for cell in row[1:]] for row in list(csv.reader(handle))[1:]])
    assert counts.sum() == metrics["num_examples"]["test"]
    assert metrics["test_accuracy"] == pytest.approx(np.trace(counts) / counts.sum(), abs=1e-6)
    assert math.isfinite(metrics["test_loss"]) and math.isfinite(metrics["val_loss"])
    return metrics


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> tuple[Path, Path]:
    """(CIFAR-format data folder, run folder) of one tiny run trained by `run.py` for 2 epochs, dropout on
    (the CIFAR default 0.5): 5 x 16 training records (16 held out for validation) and 24 test records. Its
    folder holds `.hydra/config.yaml`, so it serves `checkpoint=RUN` as users type it. Shared by every test
    that evaluates, predicts, exports or reuses a run's config; none of them may write into it.

    Trained once per `pytest` run: the xdist workers share it through their common temporary folder, the first
    to need it training it under a lock while the others wait (pytest-xdist's recipe for session fixtures)."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()  # under xdist, each worker's own folder in the run's
    root = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "trained"
    root.mkdir(exist_ok=True)
    data, run_dir, done = root / "cifar", root / "run", root / "trained.done"
    with open(root / "trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(run_dir, ignore_errors=True)  # a worker's failed attempt
            write_cifar(data, records_per_file=16, num_test=24)
            result = run_cli([*cifar_overrides(data), "trainer.epochs=2", f"hydra.run.dir={run_dir}"], cwd=root)
            assert result.returncode == 0, result.stderr[-3000:]
            done.touch()
    return data, run_dir


# Run folders (test_run_folder_*.py): a kill is timed by patching the trainer inside a subprocess that then kills
# itself at that exact point (inside a checkpoint save, inside the backup commit, in epoch 1, in the test
# evaluation); the resumes that follow run in this process.

# Runs run.py's main() after `patch`, the way `python run.py ARGS` would.
PATCHED_RUN = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
{patch}
sys.argv = ["run.py", *{arguments!r}]
runpy.run_path({root!r} + "/run.py", run_name="__main__")
"""


def kill_in_write(module: str, name_end: str, call: int) -> str:
    """A patch that SIGKILLs the process during the `call`-th atomic write of a file named `...name_end`
    by `module`: the new file is complete in its temporary, the rename has not happened."""
    return f"""
import {module} as target
original, calls = target.write_atomic, []
def write_atomic(path, write):
    if str(path).endswith({name_end!r}):
        calls.append(path)
        if len(calls) == {call}:
            def write_then_die(temporary):
                write(temporary)
                os.kill(os.getpid(), signal.SIGKILL)
            return original(path, write_then_die)
    return original(path, write)
target.write_atomic = write_atomic
"""


def signal_in_first_step(signum: int) -> str:
    """A patch that sends the process `signum` at the end of its first training step."""
    return f"""
import trainer.training.callbacks as target
target.EpochLog.on_train_batch_end = lambda self, batch, logs=None: os.kill(os.getpid(), {int(signum)})
"""


def stop_after_steps(monkeypatch, steps: int, signum: int = signal.SIGTERM) -> None:
    """Sends this process `signum` at the end of its `steps`-th training step (StopOnSignal's handler takes it):
    a preempted run in this process, for the cases that need no kill."""
    from trainer.training import callbacks

    done, original = [], callbacks.EpochLog.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        original(self, batch, logs)
        done.append(batch)
        if len(done) == steps:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(callbacks.EpochLog, "on_train_batch_end", on_train_batch_end)


def run_patched(cwd: Path, arguments: list[str], patch: str = "", process: bool = False, timeout: float = 300):
    """`python run.py ARGUMENTS`: in a real process when the case needs one (a kill patched in, a full disk whose
    HDF5 handles must not outlive the test), else in this process (`run_cli`)."""
    if not (patch or process):
        return run_cli(arguments, cwd=cwd)
    script = PATCHED_RUN.format(root=str(ROOT), patch=textwrap.dedent(patch), arguments=arguments)
    command = [sys.executable, "-c", script] if patch else [sys.executable, str(ROOT / "run.py"), *arguments]
    return subprocess.run(command, cwd=cwd, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=timeout)


def train_arguments(tmp_path: Path, run_dir: Path, epochs: int, model: str = "tiny") -> list[str]:
    """A tiny CIFAR-format run of `epochs` epochs into `run_dir`: the three-layer test model, or VGG19 where the
    case depends on it (a disk sized for VGG19's checkpoints, VGG19's keys in a saved config)."""
    data = write_cifar(tmp_path / "cifar")
    overrides = tiny_overrides(data) if model == "tiny" else cifar_overrides(data)
    return [*overrides, f"trainer.epochs={epochs}", f"hydra.run.dir={run_dir}"]


def history_epochs(run_dir: Path) -> list[int]:
    """The epochs of the run's history.csv, [] before it exists."""
    history = run_dir / "history.csv"
    if not history.is_file():
        return []
    return [int(row["epoch"]) for row in csv_rows(history)]


def backup_epoch(run_dir: Path) -> int:
    """The epoch the run's backup committed."""
    from trainer.runs.backup import METADATA

    return json.loads((run_dir / "backup" / METADATA).read_text())["epoch"]


def temporaries(run_dir: Path) -> list[Path]:
    """The temporary files an atomic write left in the run folder."""
    return [path for path in run_dir.rglob(".*tmp-*")]


def resume_run(tmp_path: Path, run_dir: Path, *extra: str):
    """`python run.py resume=RUN`: nothing else is needed."""
    resumed = run_patched(tmp_path, [f"resume={run_dir}", *extra])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed


def assert_finished_once(run_dir: Path, epochs: int) -> None:
    """Every epoch once in history.csv and metrics.json; no backup and no temporary file left."""
    assert history_epochs(run_dir) == list(range(1, epochs + 1))
    assert json.loads((run_dir / "metrics.json").read_text())["epochs_completed"] == epochs
    assert not (run_dir / "backup").exists(), "the backup goes once metrics.json is written"
    assert temporaries(run_dir) == [], "no temporary file is left behind"


TIERS = ("unit", "integration", "e2e")


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Every test belongs to exactly one tier, so `pytest -m unit` (or integration, e2e) runs a whole tier. One
    that does not is a collection error of its file naming it (in every process, so xdist reports it too)."""
    made = yield
    for item in made if isinstance(made, list) else [made]:
        if isinstance(item, pytest.Function):
            tiers = [tier for tier in TIERS if any(mark.name == tier for mark in item.iter_markers())]
            if len(tiers) != 1:
                raise collector.CollectError(
                    f"{item.nodeid}: {len(tiers)} tier markers ({', '.join(tiers) or 'none'}); give it exactly one "
                    f"of {', '.join(TIERS)} (a module's pytestmark counts)"
                )
    return made


@pytest.fixture
def decoded(monkeypatch, tmp_path):
    """The files the folder check decodes, in order (each call of `decode_files` with its paths); the verdicts
    kept under this test's own cache folder, so none comes from an earlier run."""
    from trainer.data import folder as folder_module

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls: list[str] = []
    original = folder_module.decode_files

    def counted(paths, *args, **kwargs):
        calls.extend(paths)
        return original(paths, *args, **kwargs)

    monkeypatch.setattr(folder_module, "decode_files", counted)
    return calls
