"""No two runs in one folder: folders claimed per process, one writer per folder (its lock), trainings at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import (
    PATCHED_RUN,
    ROOT,
    SUBPROCESS_ENV,
    assert_finished_once,
    cifar_overrides,
    history_epochs,
    run_patched,
    signal_in_first_step,
    train_arguments,
    write_cifar,
)
from trainer.runs.folders import claim_new_folder
from trainer.runs.locks import RunLocked, run_lock

# --- no collisions -------------------------------------------------------------------------------------


CLAIM = "import sys; from trainer.runs.folders import claim_new_folder; print(claim_new_folder(sys.argv[1]))"


@pytest.mark.e2e
def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    path = str(tmp_path / "outputs" / "2026-11-30" / "12-00-00")
    processes = [
        subprocess.Popen([sys.executable, "-c", CLAIM, path], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    folders = sorted(process.communicate(timeout=60)[0].strip() for process in processes)
    assert folders == [path, f"{path}-2", f"{path}-3", f"{path}-4"]
    assert claim_new_folder(path) == claim_new_folder(path), "one answer per process, however often resolved"


@pytest.mark.unit
def test_run_and_sweep_folders_are_claimed_through_the_config(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trainer.config import register

    monkeypatch.chdir(tmp_path)
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        folder = tmp_path / OmegaConf.select(cfg, key)
        assert folder.is_dir(), f"{key} is claimed (created) when resolved: no other run can take it"
    assert OmegaConf.select(cfg, "hydra.output_subdir") == ".hydra"


@pytest.mark.unit
def test_a_second_writer_gets_one_error_naming_the_holder(tmp_path):
    with run_lock(tmp_path):
        holder = json.loads((tmp_path / ".lock").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(RunLocked, match=rf"{tmp_path} is in use by process {os.getpid()} on host "):
            with run_lock(tmp_path):
                pass
    with run_lock(tmp_path):  # released at exit
        pass


@pytest.mark.e2e
def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pathlib import Path; from trainer.runs.locks import run_lock\n"
            "with run_lock(Path(sys.argv[1])): os.kill(os.getpid(), signal.SIGKILL)",
            str(tmp_path),
        ],
        cwd=ROOT,
    )
    assert holder.wait(timeout=60) == -signal.SIGKILL
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid, "the dead holder's lock file stays"
    with caplog.at_level("WARNING"), run_lock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert f"from process {holder.pid} on host {socket.gethostname()}, which is no longer running" in caplog.text


@pytest.mark.unit
@pytest.mark.parametrize("content", ["5", "null", '"text"', '{"pid": "x"}', "[1, 2]", "{not json"])
def test_a_damaged_lock_file_is_taken_over(tmp_path, content):
    (tmp_path / ".lock").write_text(content)
    with run_lock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


# --- no collisions: the real thing (several trainings at once) -----------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_two_trainings_with_one_folder_name_get_two_folders(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    same_second = 'hydra.run.dir="${worker_dir:outputs/same-second,${resume}}"'  # two runs at 12:00:00 resolve that
    command = [sys.executable, str(ROOT / "run.py"), *cifar_overrides(data), same_second]
    processes = [
        subprocess.Popen(
            command, cwd=tmp_path, env=SUBPROCESS_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors
    folders = sorted(path.name for path in (tmp_path / "outputs").iterdir())
    assert folders == ["same-second", "same-second-2"]
    for name in folders:
        assert history_epochs(tmp_path / "outputs" / name) == [1]
        assert json.loads((tmp_path / "outputs" / name / "metrics.json").read_text())["epochs_completed"] == 1


HOLD_IN_FIRST_STEP = """
import time
from pathlib import Path
import trainer.training.callbacks as target
def wait_for_go(self, batch, logs=None):
    go = Path({go!r})
    while not go.exists():
        time.sleep(0.1)
target.EpochLog.on_train_batch_end = wait_for_go
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_a_second_resume_of_a_running_resume_gets_the_lock_error(tmp_path):
    run_dir = tmp_path / "run"
    killed = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2), signal_in_first_step(signal.SIGKILL))
    assert killed.returncode == -signal.SIGKILL
    go = tmp_path / "go"
    script = PATCHED_RUN.format(
        root=str(ROOT), patch=HOLD_IN_FIRST_STEP.format(go=str(go)), arguments=[f"resume={run_dir}"]
    )
    first = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, env=SUBPROCESS_ENV, stderr=subprocess.PIPE, text=True
    )
    try:
        while not (run_dir / ".lock").read_text().startswith(f'{{"pid": {first.pid},'):
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.2)
        second = run_patched(tmp_path, [f"resume={run_dir}"])
    finally:
        go.touch()
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert second.returncode == 1
    assert (
        second.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {run_dir} is in use by process {first.pid} on host {socket.gethostname()} (since ")
    )
    assert_finished_once(run_dir, 2)
