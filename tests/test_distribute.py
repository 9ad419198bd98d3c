"""Strategies train the same model: mirrored on 2 logical CPUs, and 2 multi-worker processes on 127.0.0.1.

The mirrored runs go in this process, on the two logical CPUs conftest.py sets up before
TensorFlow starts; each multi-worker run is two `python run.py` processes: its runtime is
the process's own.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import (
    ROOT,
    SUBPROCESS_ENV,
    consecutive_free_ports,
    csv_rows,
    free_ports,
    launch_workers,
    run_cli,
    write_cifar,
)
from trainer.distribute import cluster
from trainer.errors import ClusterError, ConfigError

# The three-layer test model (tests/tiny_model.py): the strategies are the point, not the model.
TINY = ["model=custom", "model._target_=tiny_model.build", "trainer.verbose=0", "trainer.epochs=1"]
SMALL = ["dataset=cifar", "dataset.val_size=16", "trainer.batch_size=16", "trainer.steps_per_epoch=4", *TINY]


def _run(data_dir: Path, *overrides: str) -> str:
    """`python run.py` with SMALL on `data_dir` and `overrides`, in this process; returns its log."""
    arguments = [*SMALL, f"dataset.data_dir={data_dir}", *overrides]
    result = run_cli(arguments, cwd=data_dir.parent)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _weights(run_dir: Path) -> list[np.ndarray]:
    return keras.saving.load_model(run_dir / "checkpoints" / "last.keras").get_weights()


def _max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.mark.integration
def test_mirrored_on_two_devices_trains_the_same_weights_as_single(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    # No randomness inside the model (dropout, the flip and colour jitter layers): each replica draws its own there.
    no_color = [
        "dataset.augment.flip=false",
        "dataset.augment.brightness=0",
        "dataset.augment.contrast_lower=1",
        "dataset.augment.contrast_upper=1",
    ]
    # The three-layer test model: no dropout, no batch norm (the point is the strategy, not the model); no
    # evaluation report (its figures are drawn after training, three times here for nothing).
    common = ["seed=3", *no_color, "evaluate.report=false"]
    runs = {}
    for name, extra in [
        ("single", ["strategy=single"]),
        ("mirrored", ["strategy=mirrored", "strategy.cpu_devices=2"]),
        ("fewer_steps", ["strategy=single", "trainer.steps_per_epoch=3"]),
    ]:
        output = _run(data, *common, *extra, f"hydra.run.dir={tmp_path / name}")
        runs[name] = _weights(tmp_path / name)
        if name == "mirrored":
            assert "Global batch 16 = 2 replica(s) x 8" in output
        if name == "single":  # no distribution at all: a OneDeviceStrategy made each CPU step 2.3x slower
            assert "Strategy TensorFlow's default strategy with 1 replica(s)" in output
    assert _max_difference(runs["single"], runs["mirrored"]) < 1e-5
    # The tolerance is far below what one training step changes (1e-3 with SGD; Adam's first steps ~1e-3 too).
    assert _max_difference(runs["single"], runs["fewer_steps"]) > 1e-4


def _start_workers(
    tmp_path: Path,
    data: Path,
    *overrides: str,
    ports: list[int] | None = None,
    indices: list[int] = (0, 1),
    own_arguments: dict[int, list[str]] | None = None,
) -> list[subprocess.Popen]:
    """Two `python run.py strategy=multi_worker` processes on 127.0.0.1 (or those of `indices`), training the
    three-layer test model in `tmp_path`, each with a temporary folder of its own (TMPDIR=tmp_path/tmpINDEX) and
    the overrides `own_arguments` gives its index, after the common ones."""

    def own_scratch(index: int) -> tuple[list[str], dict[str, str]]:
        scratch = tmp_path / f"tmp{index}"
        scratch.mkdir(exist_ok=True)
        return (own_arguments or {}).get(index, []), {"TMPDIR": str(scratch)}

    arguments = [*SMALL, f"dataset.data_dir={data}", "strategy=multi_worker", *overrides]
    return launch_workers(arguments, tmp_path, ports, indices, env=SUBPROCESS_ENV, per_worker=own_scratch)


@pytest.mark.e2e
@pytest.mark.slow  # 27 s; the slow tier's kill, preemption, Slurm and TFJob runs train two workers as well
def test_two_workers_train_identical_weights_and_only_the_chief_writes(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    # The test model has no batch norm, whose moving statistics would be each worker's own.
    workers = _start_workers(tmp_path, data, "trainer.epochs=2")
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]

    fingerprints = [re.findall(r"Final weights sha256 (\w+)", output) for output in outputs]
    assert fingerprints[0] and fingerprints[0] == fingerprints[1]
    tests = [re.findall(r"Test accuracy [\d.]+, test loss [\d.]+", output) for output in outputs]
    assert tests[0] and tests[0] == tests[1], "evaluation must give the same metrics on both workers"

    run_dirs = list((tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 1, "only the chief writes a run folder"
    run_dir = run_dirs[0]
    for name in ("metrics.json", "history.csv", "checkpoints/best.keras", "checkpoints/last.keras", "run.log"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "metrics.json").read_text())["weights_sha256"] == fingerprints[0][0]
    assert not list((tmp_path / "tmp1").iterdir()), "the other worker must clean up its temporary folder"


def _finish(workers: list[subprocess.Popen]) -> list[str]:
    """Every worker's output, once each exited 0."""
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * len(workers), outputs[0][-3000:] + outputs[1][-3000:]
    return outputs


def _final_sha(output: str) -> str:
    return re.findall(r"Final weights sha256 (\w+)", output)[-1]


@pytest.mark.e2e
@pytest.mark.slow  # ~3 min: four two-worker runs
def test_a_killed_then_preempted_worker_run_resumes_to_the_weights_of_a_run_never_stopped(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    # Dropout and the flip draw from seed states the backup holds; deterministic ops make the sums exact.
    common = ["trainer.epochs=8", "trainer.steps_per_epoch=40", "trainer.deterministic=true"]
    common += ["strategy.timeout_seconds=60"]
    (tmp_path / "never_stopped").mkdir()
    reference = _final_sha(_finish(_start_workers(tmp_path / "never_stopped", data, *common))[0])

    # 1. SIGKILL worker 1 in epoch 3: the chief stops with one line naming it, the epoch and the resume.
    chief, other = _start_workers(tmp_path, data, *common)
    lines = list(_lines_until(chief, "Epoch 2/"))
    other.send_signal(signal.SIGKILL)
    other.wait()
    killed = time.monotonic()
    output = "".join(lines) + chief.communicate(timeout=120)[0]
    assert chief.returncode == 1, output[-3000:]
    took = time.monotonic() - killed
    print(f"the survivor stopped {took:.1f} s after worker 1 was killed")  # for the note (pytest -s)
    assert took < 60, "the survivor must stop within strategy.timeout_seconds"
    run_dir = next((tmp_path / "outputs").glob("*/*"))
    last = output.strip().splitlines()[-1]
    assert re.search(r"error: strategy=multi_worker: worker1 at 127\.0\.0\.1:\d+ stopped answering", last), last
    resume = f"restart every worker with resume={run_dir}."
    assert re.search(r"epoch \d+ did not finish, epoch \d+ is the last saved; ", last) and resume in last, last

    # 2. Resumed on both (before the fix, worker 1 trained from epoch 1 while the chief went on from its
    # backup), then SIGTERM to both at once, as a preemption: both stop at the same step, saved.
    resumed = _start_workers(tmp_path, data, *common, f"resume={run_dir}")
    lines = list(_lines_until(resumed[0], "Epoch 4/"))
    for worker in resumed:
        worker.send_signal(signal.SIGTERM)
    outputs = _finish(resumed)
    stops = [re.findall(r"Stopped by SIGTERM (in epoch \d+, after step \d+|after epoch \d+);", out) for out in outputs]
    assert stops[0] and stops[0] == stops[1], outputs[1][-2000:]
    assert f"To continue, run on every worker: python run.py resume={run_dir}" in outputs[0]
    assert "The chief's backup holds" in outputs[1]

    # 3. Resumed again: every epoch once, and the weights of the run never stopped.
    outputs = _finish(_start_workers(tmp_path, data, *common, f"resume={run_dir}"))
    assert _final_sha(outputs[0]) == _final_sha(outputs[1]) == reference
    epochs = [row["epoch"] for row in csv_rows(run_dir / "history.csv")]
    assert epochs == [str(epoch) for epoch in range(1, 9)], "every epoch once"
    assert json.loads((run_dir / "metrics.json").read_text())["weights_sha256"] == reference


@pytest.mark.e2e
@pytest.mark.slow  # ~60 s: three processes
def test_a_tfjob_with_chief_worker_and_evaluator_trains_and_the_evaluator_watches_the_run(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    ports = free_ports(2)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}  # as Kubeflow's TFJob sets it
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "run.py"), *SMALL, f"dataset.data_dir={data}", "strategy=multi_worker"]
    command += ["trainer.epochs=3", "trainer.steps_per_epoch=40"]
    tasks = {
        "chief": [f"hydra.run.dir={run_dir}"],
        "worker": [],
        "evaluator": [f"checkpoint={run_dir}"],  # the same training command, told which run to watch
    }
    processes = {}
    for task_type, extra in tasks.items():
        scratch = tmp_path / task_type
        scratch.mkdir()
        tf_config = json.dumps({"cluster": spec, "task": {"type": task_type, "index": 0}})
        env = {**SUBPROCESS_ENV, "TF_CONFIG": tf_config, "TMPDIR": str(scratch)}
        processes[task_type] = subprocess.Popen(
            [*command, *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    outputs = {name: process.communicate(timeout=300)[0] for name, process in processes.items()}
    codes = {name: process.returncode for name, process in processes.items()}
    assert codes == {"chief": 0, "worker": 0, "evaluator": 0}, outputs["evaluator"][-3000:]
    assert "Epoch 1/" not in outputs["evaluator"], "the evaluator trains nothing"

    rows = csv_rows(run_dir / "eval" / "eval_history.csv")
    assert [row["split"] for row in rows][-1] == "test" and int(rows[-2]["epoch"]) == 3
    final = json.loads((run_dir / "metrics.json").read_text())
    assert float(rows[-1]["accuracy"]) == pytest.approx(final["test_accuracy"], abs=1e-6)
    assert not list((tmp_path / "evaluator").iterdir()), "the evaluator leaves no temporary folder"


@pytest.mark.e2e
@pytest.mark.slow  # ~30 s
def test_a_two_task_slurm_job_trains_on_slurms_variables_alone(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    base = consecutive_free_ports(2)
    processes = []
    for rank in range(2):  # what `srun` sets for a 2-task step on one node (CPU only: no nvidia-smi)
        slurm = {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_STEP_TASKS_PER_NODE": "2(x1)",
        }
        env = {key: value for key, value in SUBPROCESS_ENV.items() if key != "TF_CONFIG"}
        (tmp_path / f"tmp{rank}").mkdir()
        command = [sys.executable, str(ROOT / "run.py"), *SMALL, f"dataset.data_dir={data}", "strategy=multi_worker"]
        processes.append(
            subprocess.Popen(
                [*command, "strategy.cluster=slurm", f"strategy.slurm_port_base={base}"],
                cwd=tmp_path,
                env={**env, **slurm, "TMPDIR": str(tmp_path / f"tmp{rank}")},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = _finish(processes)
    assert _final_sha(outputs[0]) == _final_sha(outputs[1])
    assert "with 2 replica(s) <strategy=multi_worker>" in outputs[0], outputs[0][-2000:]
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 1, "only rank 0, the chief, writes a run folder"


@pytest.mark.e2e
@pytest.mark.slow  # ~40 s
def test_restarting_only_the_killed_worker_gives_one_line_on_each_not_a_split_run(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    common = ["trainer.epochs=200", "trainer.steps_per_epoch=40", "strategy.startup_timeout=15"]
    ports = free_ports(2)
    chief, other = _start_workers(tmp_path, data, *common, ports=ports)
    lines = list(_lines_until(chief, "Epoch 2/"))
    other.send_signal(signal.SIGKILL)
    other.wait()
    killed = time.monotonic()
    (restarted,) = _start_workers(tmp_path, data, *common, ports=ports, indices=[1])  # the same command again
    outputs = ["".join(lines) + chief.communicate(timeout=120)[0], restarted.communicate(timeout=120)[0]]
    print(f"the chief and the restarted worker stopped {time.monotonic() - killed:.1f} s after the kill")
    assert [chief.returncode, restarted.returncode] == [1, 1], outputs[1][-2000:]
    assert "error: strategy=multi_worker: worker1 at" in outputs[0].strip().splitlines()[-1]
    assert (
        outputs[1]
        .strip()
        .splitlines()[-1]
        .startswith(f"error: strategy=multi_worker: worker0 at 127.0.0.1:{ports[0]} did not come up")
    )
    assert "Epoch 1/" not in outputs[1], "the restarted worker must not train alone"


@pytest.mark.e2e
@pytest.mark.slow  # ~20 s
def test_a_chief_gone_between_answering_and_the_cluster_connecting_is_one_line_within_the_startup_timeout(tmp_path):
    # What a restarted worker met when its chief ended just after its port answered: a port that accepts the
    # connection and never registers the worker. TensorFlow alone waited an hour for it.
    data = write_cifar(tmp_path / "cifar")
    ports = free_ports(2)
    with socket.create_server(("127.0.0.1", ports[0])):
        (worker1,) = _start_workers(tmp_path, data, "strategy.startup_timeout=8", ports=ports, indices=[1])
        output = worker1.communicate(timeout=120)[0]
    assert worker1.returncode == 1, output[-2000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith(
            f"error: strategy=multi_worker: worker0 at 127.0.0.1:{ports[0]} did not come up within "
            "strategy.startup_timeout=8 s"
        )
    ), output[-2000:]


@pytest.mark.e2e
@pytest.mark.slow  # ~30 s: two lone workers wait for peers that never come
def test_a_worker_whose_peer_never_comes_says_whom_it_waits_for_and_stops(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    lone = {}
    for name, timeout in (("timed_out", 13), ("terminated", 600)):
        (tmp_path / name).mkdir()
        ports = free_ports(2)
        env = {**SUBPROCESS_ENV, "TMPDIR": str(tmp_path / name)}
        arguments = [*SMALL, f"dataset.data_dir={data}", "strategy=multi_worker", f"strategy.startup_timeout={timeout}"]
        (worker0,) = launch_workers(arguments, tmp_path / name, ports, indices=[0], env=env)  # worker 1 never comes
        lone[name] = (worker0, ports[1])
    process, port = lone["terminated"]
    lines = list(_lines_until(process, "Waiting for"))
    assert f"Waiting for worker1 at 127.0.0.1:{port} (" in lines[-1], "".join(lines)[-2000:]
    process.send_signal(signal.SIGTERM)  # TensorFlow's own handler ignored it there, and Ctrl-C too
    output = "".join(lines) + process.communicate(timeout=20)[0]
    assert process.returncode == 1, output[-2000:]
    assert output.strip().splitlines()[-1] == (
        f"error: strategy=multi_worker: stopped by SIGTERM while waiting for worker1 at 127.0.0.1:{port}"
    )

    process, port = lone["timed_out"]
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 1, output[-2000:]
    assert f"Waiting for worker1 at 127.0.0.1:{port} (" in output, "logged every 10 s"
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith(
            f"error: strategy=multi_worker: worker1 at 127.0.0.1:{port} did not come up within "
            "strategy.startup_timeout=13 s"
        )
    )
    assert not list((tmp_path / "timed_out").glob("outputs/*/*")), "a run that never started leaves no folder"


@pytest.mark.e2e
@pytest.mark.slow  # ~20 s a case
@pytest.mark.parametrize("when", ["in_training", "at_start_up"])
def test_a_workers_own_error_stops_its_peer_at_once_with_that_workers_line(tmp_path, when):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    if when == "in_training":  # a callback fails worker 1 after epoch 2
        own = "worker 1 fails on purpose after epoch 2"
        fail = ["+callbacks.fail._target_=tiny_model.FailOnWorker", "+callbacks.fail.task_index=1"]
        extra = {0: [], 1: []}, [*fail, "+callbacks.fail.epoch=2"]
    else:  # worker 1's own copy of the data holds a bad label, which its start-up check finds
        copy = tmp_path / "copy"
        shutil.copytree(data, copy)
        records = bytearray((copy / "data_batch_1.bin").read_bytes())
        records[3073 * 5] = 200  # the label byte of record 5
        (copy / "data_batch_1.bin").write_bytes(bytes(records))
        own = f"{copy / 'data_batch_1.bin'}: record 5 has label 200, expected 0 to 9 (dataset.num_classes=10)"
        extra = {0: [], 1: [f"dataset.data_dir={copy}"]}, []
    ports = free_ports(2)
    # A timeout far longer than the test: the peer must learn of the error, not wait for a collective to time out.
    common = ["trainer.epochs=6", "strategy.timeout_seconds=300", *extra[1]]
    workers = _start_workers(tmp_path, data, *common, ports=ports, own_arguments=extra[0])
    ended = {}
    while len(ended) < 2:
        for index, worker in enumerate(workers):
            if index not in ended and worker.poll() is not None:
                ended[index] = time.monotonic()
        time.sleep(0.1)
    outputs = [worker.stdout.read() for worker in workers]
    assert [worker.returncode for worker in workers] == [1, 1], outputs[0][-2000:] + outputs[1][-2000:]
    assert outputs[1].strip().splitlines()[-1] == f"error: {own}"
    last = outputs[0].strip().splitlines()[-1]
    assert last.startswith(f"error: strategy=multi_worker: worker1 at 127.0.0.1:{ports[1]} stopped: error: {own}; ")
    if when == "in_training":
        run_dir = next((tmp_path / "outputs").glob("*/*"))
        assert last.endswith(
            f"epoch 3 did not finish, epoch 2 is the last saved; restart every worker with resume={run_dir}"
        )
    else:  # nothing was trained: the model's variables were being broadcast, which is not the model's fault
        assert last.endswith("; restart every worker with the same command") and "model._target_" not in last
    assert "Op:" not in last and "Restart your program" not in last, "TensorFlow's own sentences stay out"
    print(f"the chief stopped {ended[0] - ended[1]:.1f} s after worker 1 ({when})")  # for the note (pytest -s)
    assert ended[0] - ended[1] < 60, "the chief stopped once told, not after strategy.timeout_seconds"


def lost_peer(**_: object) -> None:
    """A `_target_` whose call fails as a variable's broadcast fails when a peer stopped."""
    raise tf.errors.UnavailableError(None, None, "Collective ops is aborted by: /job:worker/task:1 is unhealthy")


@pytest.mark.unit
def test_a_peer_lost_while_a_part_is_built_is_not_blamed_on_the_part():
    from trainer.distribute.failures import is_peer_failure
    from trainer.errors import ConfigError
    from trainer.models.registry import build_model
    from trainer.targets import build_target
    from trainer.training.optimizers import build_optimizer

    with pytest.raises(tf.errors.UnavailableError):  # for collective_errors to name the worker, not model._target_
        build_model("test_distribute.lost_peer", {}, num_classes=2, input_shape=(32, 32, 3))
    with pytest.raises(tf.errors.UnavailableError):  # the optimizer's variables are broadcast too
        build_optimizer("test_distribute.lost_peer", 0.1, {})
    with pytest.raises(ConfigError, match=r"^callbacks.x._target_=test_distribute.lost_peer"):  # no broadcast there
        build_target("callbacks.x", "test_distribute.lost_peer", {})

    assert is_peer_failure(tf.errors.InternalError(None, None, "Collective ops is aborted by: x"))
    assert not is_peer_failure(tf.errors.InternalError(None, None, "a bug"))
    assert not is_peer_failure(tf.errors.InvalidArgumentError(None, None, "a bad shape"))


def _lines_until(process: subprocess.Popen, text: str, limit: float = 240):
    """The process's output lines up to the first that holds `text` (or `limit` seconds)."""
    started = time.monotonic()
    for line in process.stdout:
        yield line
        if text in line or time.monotonic() - started > limit:
            return


@pytest.mark.unit
@pytest.mark.parametrize(
    "tf_config, workers, task_index, chief",
    [
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}', None, None, True),
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}', None, None, False),
        (
            '{"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
            None,
            None,
            False,
        ),
        ('{"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', None, None, True),
        (None, ["a:1", "b:1"], 1, False),
        (None, ["a:1", "b:1"], 0, True),
        (None, None, None, True),
    ],
)
def test_only_one_process_is_the_chief(monkeypatch, tf_config, workers, task_index, chief):
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    if tf_config:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    else:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.worker_role("auto", workers, task_index).is_chief is chief


@pytest.mark.unit
def test_cluster_settings_are_checked(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="strategy.task_index"):
        cluster.worker_role("auto", ["a:1", "b:1"], 2)
    with pytest.raises(ConfigError, match="strategy.cluster"):
        cluster.worker_role("mpi", None, None)
    with pytest.raises(ConfigError, match="strategy.workers: worker0 and worker1 have the same address a:1"):
        cluster.worker_role("auto", ["a:1", "a:1"], 1)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        cluster.worker_role("auto", None, None)


def _role(cluster_spec: dict, task_type: str, index: int) -> cluster.Role:
    return cluster._from_tf_config(json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}}))


@pytest.mark.unit
def test_the_tf_config_of_each_cluster_manager_gives_one_chief_and_bad_ones_one_line():
    # Kubeflow TFJob: chief + workers (its evaluator is outside the cluster).
    tfjob = {"chief": ["job-chief-0:2222"], "worker": ["job-worker-0:2222"]}
    assert _role(tfjob, "chief", 0).is_chief and not _role(tfjob, "worker", 0).is_chief
    assert _role(tfjob, "worker", 0).num_workers == 2
    # Vertex AI's CustomJob: worker pool 0 is the chief, pool 1 the workers; extra keys beside cluster and task.
    vertex = {
        "cluster": {"chief": ["workerpool0-0:2222"], "worker": ["workerpool1-0:2222", "workerpool1-1:2222"]},
        "environment": "cloud",
        "task": {"type": "worker", "index": 1, "trial": ""},
        "job": json.dumps({"python_module": "", "package_uris": []}),
    }
    role = cluster._from_tf_config(json.dumps(vertex))
    assert not role.is_chief and role.num_workers == 3 and role.task_index == 1
    # Ray's TensorflowTrainer: workers only; worker 0 is the chief.
    ray = {"worker": ["10.0.0.1:3000", "10.0.0.2:3000"]}
    assert _role(ray, "worker", 0).is_chief and not _role(ray, "worker", 1).is_chief

    with pytest.raises(ConfigError, match=r"'master' is not one TensorFlow knows; name it 'chief'"):
        _role({"master": ["m:1"], "worker": ["w:1"]}, "master", 0)
    with pytest.raises(ConfigError, match=r"this task is worker 2, outside the cluster's 2 worker address"):
        _role(ray, "worker", 2)
    with pytest.raises(ConfigError, match=r"chief0 and worker0 have the same address h:1"):
        _role({"chief": ["h:1"], "worker": ["h:1"]}, "worker", 0)
    with pytest.raises(ConfigError, match=r"'ps' tasks; MultiWorkerMirroredStrategy trains on chief and worker"):
        _role({"ps": ["p:1"], "worker": ["w:1"]}, "worker", 0)
    # TFJob's and Vertex AI's evaluator: beside the cluster (listed in it or not), it trains nothing.
    for spec in (tfjob, {**tfjob, "evaluator": ["job-evaluator-0:2222"]}):
        evaluator = _role(spec, "evaluator", 0)
        assert evaluator.is_evaluator and not evaluator.is_chief and evaluator.num_workers == 2
    with pytest.raises(ConfigError, match=r"this task is evaluator 1; a cluster has one evaluator"):
        _role(tfjob, "evaluator", 1)
    with pytest.raises(ConfigError, match=r"this task's type is 'trainer'"):
        _role(tfjob, "trainer", 0)


@pytest.mark.integration
def test_a_bad_tf_config_is_one_line_before_any_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"master": ["m:1"]}, "task": {"type": "master", "index": 0}}')
    result = run_cli(["strategy=multi_worker"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: TF_CONFIG: the task type 'master' is not one TensorFlow knows; name it 'chief' (in a Kubeflow "
        "TFJob, the replica type Chief)"
    ]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.unit
def test_single_is_the_default_strategy_unless_a_device_is_pinned():
    import tensorflow as tf

    from trainer.distribute import strategies

    assert strategies.single() is tf.distribute.get_strategy()
    pinned = strategies.single("/cpu:0")
    assert isinstance(pinned, tf.distribute.OneDeviceStrategy) and pinned.num_replicas_in_sync == 1


@pytest.mark.integration
def test_batch_not_divisible_by_replicas_is_a_startup_error(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    arguments = [*SMALL, f"dataset.data_dir={data}", "strategy=mirrored", "strategy.cpu_devices=2"]
    result = run_cli([*arguments, "trainer.batch_size=15", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: trainer.batch_size=15 must be divisible by the 2 replicas of the strategy"
    )


@pytest.mark.unit
def test_waiting_for_peers_returns_once_they_answer_and_names_the_missing_ones(caplog):
    from trainer.distribute.startup import wait_for_peers

    own, up, down = free_ports(3)
    with socket.create_server(("127.0.0.1", up)):  # a peer waiting the same way, or its TensorFlow server
        wait_for_peers(f"127.0.0.1:{own}", {"worker1": f"127.0.0.1:{up}"}, timeout=5)
        with caplog.at_level("INFO"), pytest.raises(ClusterError) as error:
            wait_for_peers(
                f"127.0.0.1:{own}", {"worker1": f"127.0.0.1:{up}", "worker2": f"127.0.0.1:{down}"}, 1.5, every=0.5
            )
        assert str(error.value).startswith(
            f"strategy=multi_worker: worker2 at 127.0.0.1:{down} did not come up within strategy.startup_timeout=1.5 s"
        )
        assert f"Waiting for worker2 at 127.0.0.1:{down} (" in caplog.text
        with pytest.raises(ClusterError, match=f"this worker's address 127.0.0.1:{up} cannot be listened on"):
            wait_for_peers(f"127.0.0.1:{up}", {"worker1": f"127.0.0.1:{down}"}, timeout=5)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cluster_spec", "message"),
    [
        ("{", "CLUSTER_SPEC must be JSON with 'cluster' and 'task' (type, index)"),
        ('{"cluster": {"workerpool9": ["a:1"]}, "task": {"type": "workerpool9", "index": 0}}',
         "CLUSTER_SPEC: unknown worker pool 'workerpool9'; Vertex AI has"),
        ('{"cluster": {"workerpool0": ["a:1"], "workerpool2": ["b:1"]}, "task": {"type": "workerpool0", "index": 0}}',
         "the cluster has 'ps' tasks"),
    ],
)  # fmt: skip
def test_a_bad_cluster_spec_is_one_line(monkeypatch, cluster_spec, message):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("CLUSTER_SPEC", cluster_spec)
    with pytest.raises(ConfigError, match=re.escape(message)):
        cluster.worker_role("auto", None, None)


@pytest.mark.unit
def test_a_step_longer_than_the_timeout_stops_the_cluster_once_and_quick_steps_never():
    import threading

    from trainer.distribute.watchdog import StepWatchdog

    told: list[str] = []
    before = threading.active_count()
    watchdog = StepWatchdog(0.4, "worker1", told.append, every=0.05)
    try:
        assert threading.active_count() == before + 1, "one thread, however many steps and collectives"
        for _ in range(6):  # steps within the timeout
            watchdog.on_train_batch_begin(0)
            time.sleep(0.1)
            watchdog.on_train_batch_end(0)
        time.sleep(0.6)  # between steps (an epoch's end, a checkpoint): nothing is timed
        assert told == []
        watchdog.on_test_batch_begin(0)  # a validation step that never ends: a peer hung
        time.sleep(1.0)
        assert len(told) == 1, "once"
        assert re.fullmatch(
            r"vggtrain worker1 stopped: <<error: a step waited \d+ s for its peers, longer than "
            r"strategy\.timeout_seconds=0\.4: .*>>",
            told[0],
        ), told[0]
    finally:
        watchdog.close()
    assert threading.active_count() == before


@pytest.mark.e2e
@pytest.mark.slow  # ~40 s
def test_a_hung_worker_stops_its_peer_after_the_timeout_with_one_line(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    hang = ["+callbacks.hang._target_=tiny_model.HangOnWorker", "+callbacks.hang.task_index=1"]
    common = ["trainer.epochs=6", "strategy.timeout_seconds=8", *hang, "+callbacks.hang.epoch=2"]
    chief, hung = _start_workers(tmp_path, data, *common)
    lines = list(_lines_until(chief, "Epoch 1/"))
    started = time.monotonic()
    try:
        output = "".join(lines) + chief.communicate(timeout=120)[0]
        took = time.monotonic() - started
    finally:
        hung.kill()  # alive and hung for ever, as the worker it stands for: nothing can end it but a kill
        hung.communicate()
    print(f"the chief stopped {took:.1f} s after epoch 1 ended (its peer hung at epoch 2's start)")
    assert chief.returncode == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert re.match(
        r"error: strategy=multi_worker: a step waited \d+ s for its peers, longer than strategy\.timeout_seconds=8: ",
        last,
    ), last
    run_dir = next((tmp_path / "outputs").glob("*/*"))
    assert last.endswith(
        f"epoch 2 did not finish, epoch 1 is the last saved; restart every worker with resume={run_dir}"
    )
    assert took < 8 + 30, "after the timeout, not TensorFlow's hour"


def _threads(pid: int) -> int | None:
    """The thread count of a live process, from /proc (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M)[1])


@pytest.mark.e2e
@pytest.mark.slow  # ~90 s
def test_two_workers_keep_a_flat_thread_count_over_600_steps(tmp_path):
    # TensorFlow's collective timeout held a sleeping thread per collective for the whole timeout: the count grew
    # by thousands a minute until the machine's process limit killed the run (the soak benchmark runs 2,000 steps).
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    workers = _start_workers(tmp_path, data, "trainer.epochs=6", "trainer.steps_per_epoch=100")
    at_epoch_end: list[list[int]] = [[], []]

    def read(index: int) -> str:
        lines = []
        for line in workers[index].stdout:
            lines.append(line)
            if re.search(r"Epoch \d+/6:", line):
                at_epoch_end[index].append(_threads(workers[index].pid))
        return "".join(lines)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outputs = list(pool.map(read, range(2)))
    codes = [worker.wait(timeout=60) for worker in workers]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    print(f"threads as each epoch ended: {at_epoch_end}")
    for counts in at_epoch_end:
        assert len(counts) == 6 and None not in counts, counts
        assert counts[-1] <= 1.2 * counts[0], f"threads grew from {counts[0]} after epoch 1 to {counts[-1]}"


@pytest.mark.e2e
@pytest.mark.slow  # ~60 s: four processes
def test_four_workers_each_read_a_quarter_and_end_with_the_same_weights(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=32)
    workers = _start_workers(tmp_path, data, "trainer.epochs=2", indices=[0, 1, 2, 3], ports=free_ports(4))
    outputs = _finish(workers)
    assert len({_final_sha(output) for output in outputs}) == 1, "the same weights on all four"
    shares = [re.search(r"Input pipeline (\d) of 4 reads (.*) <strategy=multi_worker>", out) for out in outputs]
    assert [share[1] for share in shares] == ["1", "2", "3", "4"], [out[-1500:] for out in outputs]
    print("\n".join(share[2] for share in shares))
    records = [re.search(r"\((\d+) records", share[2]) for share in shares]
    assert len({record[1] for record in records}) == 1, "a quarter each"
    assert 4 * int(records[0][1]) == 5 * 32 - 16, "together, the training split (less SMALL's 16 validation records)"
