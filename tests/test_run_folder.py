"""Run folders that cannot go wrong: every epoch exactly once whatever stops a run, resume bound to the
run's own config and folder, one writer per folder, no two runs in one folder, files the team can read.

The kills are timed by patching the trainer inside a subprocess that then kills itself at that exact
point (inside a checkpoint save, inside the backup commit, in epoch 1, in the test evaluation); the
resumes that follow run in this process.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import ROOT, SUBPROCESS_ENV, cifar_overrides, compose, run_cli, tiny_overrides, write_cifar
from trainer.errors import ConfigError, DiskError
from trainer.runs.atomic import write_atomic, write_json
from trainer.runs.backup import METADATA, PREVIOUS, RunBackup, read_state, restore
from trainer.runs.folders import claim_new_folder
from trainer.runs.locks import RunLocked, run_lock

ENV = SUBPROCESS_ENV

# Runs run.py's main() after `patch`, the way `python run.py ARGS` would.
SCRIPT = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
{patch}
sys.argv = ["run.py", *{arguments!r}]
runpy.run_path({root!r} + "/run.py", run_name="__main__")
"""


def _kill_in_write(module: str, name_end: str, call: int) -> str:
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


def _signal_in_first_step(signum: int) -> str:
    return f"""
import trainer.training.callbacks as target
target.EpochLog.on_train_batch_end = lambda self, batch, logs=None: os.kill(os.getpid(), {int(signum)})
"""


KILL_IN_EVALUATION = """
import trainer.tasks.train as target
def evaluate_checkpoint(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
target.evaluate_checkpoint = evaluate_checkpoint
"""


def _run(cwd: Path, arguments: list[str], patch: str = "", process: bool = False, timeout: float = 300):
    """`python run.py ARGUMENTS`: in a real process when the case needs one (a kill patched in, a full disk whose
    HDF5 handles must not outlive the test), else in this process (`conftest.run_cli`)."""
    if not (patch or process):
        return run_cli(arguments, cwd=cwd)
    script = SCRIPT.format(root=str(ROOT), patch=textwrap.dedent(patch), arguments=arguments)
    command = [sys.executable, "-c", script] if patch else [sys.executable, str(ROOT / "run.py"), *arguments]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def _train_arguments(tmp_path: Path, run_dir: Path, epochs: int, model: str = "tiny") -> list[str]:
    """A tiny CIFAR-format run of `epochs` epochs into `run_dir`: the three-layer test model, or VGG19 where the
    case depends on it (a disk sized for VGG19's checkpoints, VGG19's keys in a saved config)."""
    data = write_cifar(tmp_path / "cifar")
    overrides = tiny_overrides(data) if model == "tiny" else cifar_overrides(data)
    return [*overrides, f"trainer.epochs={epochs}", f"hydra.run.dir={run_dir}"]


def _epochs(run_dir: Path) -> list[int]:
    history = run_dir / "history.csv"
    if not history.is_file():
        return []
    with open(history, newline="") as handle:
        return [int(row["epoch"]) for row in csv.DictReader(handle)]


def _backup_epoch(run_dir: Path) -> int:
    return json.loads((run_dir / "backup" / METADATA).read_text())["epoch"]


def _temporaries(run_dir: Path) -> list[Path]:
    return [path for path in run_dir.rglob(".*tmp-*")]


def _resume(tmp_path: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """`python run.py resume=RUN`: nothing else is needed."""
    resumed = _run(tmp_path, [f"resume={run_dir}", *extra])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed


def _assert_finished_once(run_dir: Path, epochs: int) -> None:
    assert _epochs(run_dir) == list(range(1, epochs + 1))
    assert json.loads((run_dir / "metrics.json").read_text())["epochs_completed"] == epochs
    assert not (run_dir / "backup").exists(), "the backup goes once metrics.json is written"
    assert _temporaries(run_dir) == [], "no temporary file is left behind"


# --- epoch accounting -------------------------------------------------------------------------------

KILL_POINTS = [
    # (patch, epochs in history.csv right after the kill): the epoch is committed after its row and checkpoints
    pytest.param(_kill_in_write("trainer.training.callbacks", "last.keras", 2), [1], id="inside-checkpoint-save"),
    pytest.param(
        _kill_in_write("trainer.runs.backup", METADATA, 2),  # epoch 2's commit: written, not renamed
        [1, 2],
        id="inside-backup-commit",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("patch", "history_after_kill"), KILL_POINTS)
def test_sigkill_at_the_end_of_an_epoch_redoes_that_epoch_and_skips_none(tmp_path, patch, history_after_kill):
    run_dir = tmp_path / "run"
    killed = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=3), patch)
    assert killed.returncode == -signal.SIGKILL
    assert _epochs(run_dir) == history_after_kill
    assert _backup_epoch(run_dir) == 1, "epoch 2 is not committed: its files were not all on disk"
    assert _temporaries(run_dir), "the kill left the half-renamed file behind"
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()

    resumed = _resume(tmp_path, run_dir)
    assert f"Resuming {run_dir} after epoch 1" in resumed.stdout + resumed.stderr
    _assert_finished_once(run_dir, 3)
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == overrides, "the original .hydra/ stays"
    assert not list(tmp_path.glob("outputs")), "no new folder for the resumed run"
    log = (run_dir / "run.log").read_text()
    assert "Epoch 1/3" in log and "Resuming" in log, "the resumed run appends to RUN/run.log"
    events = [json.loads(line) for line in (run_dir / "invocations.jsonl").read_text().splitlines()]
    assert [event["event"] for event in events] == ["start", "start", "end"]  # the kill left no end line
    assert f"resume={run_dir}" in events[1]["command"] and events[2]["outcome"] == "finished"


@pytest.mark.e2e
def test_a_run_killed_and_resumed_ends_with_the_weights_of_a_run_never_killed(tmp_path):
    """The backup restores exactly (weights, optimizer state, the seed states of dropout and the model's random
    flips and colour changes) and the input goes on where it was: a resumed epoch 3 sees epoch 3's order, crops,
    flips and masks, not epoch 1's again."""
    base = [*_train_arguments(tmp_path, tmp_path / "unused", epochs=3)[:-1], "trainer.deterministic=true"]
    kill = _kill_in_write("trainer.training.callbacks", "last.keras", 3)
    killed = _run(tmp_path, [*base, f"hydra.run.dir={tmp_path / 'killed'}"], kill)
    assert killed.returncode == -signal.SIGKILL and _backup_epoch(tmp_path / "killed") == 2
    _resume(tmp_path, tmp_path / "killed")
    assert _run(tmp_path, [*base, f"hydra.run.dir={tmp_path / 'never'}"]).returncode == 0
    rows = [(tmp_path / name / "history.csv").read_text() for name in ("killed", "never")]
    assert rows[0] == rows[1]
    sha = [json.loads((tmp_path / name / "metrics.json").read_text())["weights_sha256"] for name in ("killed", "never")]
    assert sha[0] == sha[1]


SAVE_THE_WEIGHTS_AT_EPOCH_ENDS = """
import trainer.runs.backup as target
target.RunBackup.on_epoch_end = lambda self, epoch, logs=None: self.save(epoch + 1)
"""


@pytest.mark.e2e
@pytest.mark.slow  # ~35 s; the default suite's exactness test above resumes from a linked backup too
def test_a_resume_from_the_linked_checkpoint_equals_one_from_the_backups_own_save(tmp_path):
    """An epoch-end backup links last.keras (and adds the optimizer state where last.keras lacks it, as with the
    model's augmentation layers here) instead of saving the weights again: what a resume restores is the same,
    to the bit, as from a backup that saved them."""
    kill = _kill_in_write("trainer.training.callbacks", "last.keras", 3)
    digests = []
    for name, patch in (("linked", ""), ("saved", SAVE_THE_WEIGHTS_AT_EPOCH_ENDS)):
        arguments = [*_train_arguments(tmp_path, tmp_path / name, epochs=3), "trainer.deterministic=true"]
        killed = _run(tmp_path, arguments, kill + patch)
        assert killed.returncode == -signal.SIGKILL and _backup_epoch(tmp_path / name) == 2
        backup_files = [path.name for path in (tmp_path / name / "backup").iterdir()]
        assert any(name.endswith(".keras") for name in backup_files) == (name == "linked"), backup_files
        _resume(tmp_path, tmp_path / name)
        digests.append(json.loads((tmp_path / name / "metrics.json").read_text())["weights_sha256"])
    assert digests[0] == digests[1]


SIGNALS_IN_EPOCH_1 = [
    pytest.param(signal.SIGTERM, id="sigterm", marks=pytest.mark.slow),  # test_fault_tolerance's SIGTERM case
    pytest.param(signal.SIGINT, id="ctrl-c", marks=pytest.mark.slow),  # the same path as SIGTERM, and 16 s
    pytest.param(signal.SIGKILL, id="sigkill", marks=pytest.mark.slow),
]


@pytest.mark.e2e
@pytest.mark.parametrize("signum", SIGNALS_IN_EPOCH_1)
def test_a_run_stopped_in_epoch_1_resumes_from_epoch_1(tmp_path, signum):
    run_dir = tmp_path / "run"
    stopped = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2), _signal_in_first_step(signum))
    assert _epochs(run_dir) == []
    if signum == signal.SIGTERM:
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert f"To continue, run: python run.py resume={run_dir}" in stopped.stdout + stopped.stderr
        assert _backup_epoch(run_dir) == 0
    elif signum == signal.SIGINT:  # Ctrl-C: the same, then exit 130 as a shell does, and no traceback
        assert stopped.returncode == 130, stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stderr and _backup_epoch(run_dir) == 0
        assert stopped.stderr.strip().splitlines()[-1] == (
            f"interrupted (Ctrl-C); the backup is saved. To continue, run: python run.py resume={run_dir}"
        )
    else:
        assert stopped.returncode == -signal.SIGKILL
    resumed = _resume(tmp_path, run_dir)
    assert "the run finished" not in resumed.stdout + resumed.stderr
    _assert_finished_once(run_dir, 2)
    events = [json.loads(line) for line in (run_dir / "invocations.jsonl").read_text().splitlines()]
    first = ["start"] if signum == signal.SIGKILL else ["start", "end"]
    assert [event["event"] for event in events] == [*first, "start", "end"]
    outcome = {signal.SIGTERM: ["preempted"], signal.SIGINT: ["interrupted"], signal.SIGKILL: []}[signum]
    assert [event["outcome"] for event in events if event["event"] == "end"] == [*outcome, "finished"]


@pytest.mark.e2e
def test_a_kill_in_the_test_evaluation_is_resumed_into_the_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2), KILL_IN_EVALUATION)
    assert killed.returncode == -signal.SIGKILL
    assert _epochs(run_dir) == [1, 2] and not (run_dir / "metrics.json").exists()
    assert _backup_epoch(run_dir) == 2, "the backup stays until metrics.json is written"
    resumed = _resume(tmp_path, run_dir)
    output = resumed.stdout + resumed.stderr
    assert "All 2 epochs are done: running the test evaluation" in output and "Epoch 1/2" not in output
    _assert_finished_once(run_dir, 2)
    from trainer.runs.checkpoints import weights_fingerprint

    final = keras.saving.load_model(run_dir / "checkpoints" / "last.keras")
    assert json.loads((run_dir / "metrics.json").read_text())["weights_sha256"] == weights_fingerprint(final)


@pytest.mark.e2e
@pytest.mark.slow  # the kill in the test evaluation of a run that completed covers the path (16 s)
def test_an_early_stopped_run_killed_in_its_test_evaluation_resumes_into_the_evaluation_only(tmp_path):
    run_dir = tmp_path / "run"
    stop = ["callbacks=early_stopping", "callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=1.0"]
    killed = _run(tmp_path, [*_train_arguments(tmp_path, run_dir, epochs=5), *stop], KILL_IN_EVALUATION)
    assert killed.returncode == -signal.SIGKILL
    assert _epochs(run_dir) == [1, 2] and not (run_dir / "metrics.json").exists()  # stopped at epoch 2 of 5
    resumed = _resume(tmp_path, run_dir)
    output = resumed.stdout + resumed.stderr
    assert "Training ended after epoch 2 (stopped early): running the test evaluation" in output
    assert "Epoch 3/5" not in output
    _assert_finished_once(run_dir, 2)
    assert json.loads((run_dir / "metrics.json").read_text())["stopped_early"] is True


KILL_AFTER_SECOND_BEST = """
import trainer.training.callbacks as target
original, writes = target.write_atomic, []
init = target.Checkpoints.__init__
def patched_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.better = lambda new, old: True  # every epoch is a new best in this process
target.Checkpoints.__init__ = patched_init
history_end = target.HistoryLog.on_epoch_end
def unbeatable_epoch_1(self, epoch, logs=None):  # history.csv: epoch 1 is the best a resume can compare with
    history_end(self, epoch, {**logs, "val_accuracy": 1.0} if epoch == 0 else logs)
target.HistoryLog.on_epoch_end = unbeatable_epoch_1
def write_atomic(path, write):
    result = original(path, write)
    if "best" in path.name:
        writes.append(path)
        if len(writes) == 2:  # epoch 2's best is on disk, the epoch is not committed
            os.kill(os.getpid(), signal.SIGKILL)
    return result
target.write_atomic = write_atomic
"""


@pytest.mark.e2e
def test_a_best_checkpoint_of_an_uncommitted_epoch_never_becomes_best_keras(tmp_path):
    """Killed after epoch 2's new best was written, before its commit: the resume redoes epoch 2, which is not
    better than epoch 1 (history.csv says 1.0), so best.keras must hold epoch 1, not the killed attempt."""
    from trainer.runs.checkpoints import read_info, weights_fingerprint

    run_dir = tmp_path / "run"
    killed = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2), KILL_AFTER_SECOND_BEST)
    assert killed.returncode == -signal.SIGKILL and _epochs(run_dir) == [1] and _backup_epoch(run_dir) == 1
    _resume(tmp_path, run_dir)
    _assert_finished_once(run_dir, 2)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    best, last = run_dir / "checkpoints" / "best.keras", run_dir / "checkpoints" / "last.keras"
    assert metrics["best_epoch"] == 1 and read_info(best).epoch == 1 and read_info(last).epoch == 2
    assert weights_fingerprint(keras.saving.load_model(best)) != weights_fingerprint(keras.saving.load_model(last))
    assert not list((run_dir / "checkpoints").glob("best.pending*"))


def _backup_model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.unit
def test_a_truncated_backup_metadata_falls_back_to_its_bkp_copy(tmp_path):
    model = _backup_model()
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(model)
    backup.save(1)
    first = model.get_weights()
    model.set_weights([weight + 1 for weight in first])
    backup.save(2)
    assert read_state(tmp_path / "backup").epoch == 2
    metadata = tmp_path / "backup" / METADATA
    metadata.write_text(metadata.read_text()[:7])  # a torn write, as an older Keras or a full disk leaves it
    state = read_state(tmp_path / "backup")
    assert state.epoch == 1 and state.metadata.name == PREVIOUS
    model.set_weights([np.zeros_like(weight) for weight in first])
    backup.on_train_begin()
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), first, strict=True)), "epoch 1's weights"


@pytest.mark.unit
def test_a_backup_with_both_metadata_copies_unreadable_is_one_clear_error(tmp_path):
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(_backup_model())
    backup.save(1)
    backup.save(2)
    for name in (METADATA, PREVIOUS):
        (tmp_path / "backup" / name).write_text('{"epo')
    with pytest.raises(ConfigError, match=r"training_metadata.json: the backup is unreadable .* delete .*backup"):
        read_state(tmp_path / "backup")


@pytest.mark.unit
def test_the_backup_keeps_only_the_weights_its_two_metadata_files_name(tmp_path):
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(_backup_model())
    for epoch in range(1, 5):
        backup.save(epoch)
    weights = sorted(path.name for path in (tmp_path / "backup").glob("*.weights.h5"))
    assert [name[:10] for name in weights] == ["epoch00003", "epoch00004"]


def _fitted_pair(augment: bool) -> tuple[keras.Model, keras.Model]:
    """(model being fitted, inference model of its layers) after one Adam step: the same model, or a training
    model with a flip in front of the inference model's layers."""
    inputs = keras.Input((4, 4, 3))
    network = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    inference = keras.Model(inputs, network(inputs))
    training = keras.Model(inputs, network(keras.layers.RandomFlip(seed=1)(inputs))) if augment else inference
    training.compile(optimizer="adam", loss="mse")
    training.fit(np.ones((4, 4, 4, 3)), np.ones((4, 2)), verbose=0)
    return training, inference


@pytest.mark.unit
@pytest.mark.parametrize("augment", [False, True], ids=["one-model", "training-model-apart"])
def test_an_epoch_end_backup_links_the_checkpoint_and_restores_weights_and_optimizer(tmp_path, augment):
    from trainer.runs import checkpoints

    training, inference = _fitted_pair(augment)
    last = tmp_path / "checkpoints" / "last.keras"
    last.parent.mkdir()
    info = checkpoints.ModelInfo(("a", "b"), 4, 4, "none")
    backup = RunBackup(tmp_path / "backup", checkpoint=last, inference=inference)
    backup.set_model(training)
    for epoch in (1, 2, 3):
        training.optimizer.iterations.assign(epoch * 10)
        training.layers[-1].set_weights([weight + epoch for weight in training.layers[-1].get_weights()])
        checkpoints.save(inference, last, dataclasses.replace(info, epoch=epoch))
        backup.on_epoch_end(epoch - 1)
    files = sorted(path.name for path in (tmp_path / "backup").iterdir())
    assert not [name for name in files if name.endswith(".weights.h5")], "no second save of the weights"
    state = read_state(tmp_path / "backup")
    assert state.epoch == 3 and state.weights.suffix == ".keras"
    assert os.path.samefile(state.weights, last), "a hard link: no bytes written twice"
    assert state.state is not None, "the optimizer state beside the checkpoint, which holds the model only"
    assert len([name for name in files if name.startswith("epoch00003")]) == 2
    assert not [name for name in files if name.startswith("epoch00001")], "only the two committed epochs stay"
    expected = [np.asarray(variable) for variable in [*training.variables, *training.optimizer.variables]]

    fresh_training, fresh_inference = _fitted_pair(augment)
    fresh_training.fit(np.ones((4, 4, 4, 3)), np.ones((4, 2)), verbose=0)  # the flip's seed state moves on too
    fresh_training.optimizer.iterations.assign(0)
    restore(fresh_training, tmp_path / "backup", fresh_inference)
    restored = [np.asarray(variable) for variable in [*fresh_training.variables, *fresh_training.optimizer.variables]]
    assert int(fresh_training.optimizer.iterations) == 30
    for want, got in zip(expected, restored, strict=True):
        np.testing.assert_array_equal(want, got)


@pytest.mark.unit
def test_an_epoch_end_backup_saves_the_weights_itself_where_the_checkpoint_is_not_this_epochs(tmp_path):
    from trainer.runs import checkpoints

    training, inference = _fitted_pair(False)
    last = tmp_path / "last.keras"
    checkpoints.save(inference, last, checkpoints.ModelInfo(("a", "b"), 4, 4, "none", epoch=1))  # a diverged epoch 2
    backup = RunBackup(tmp_path / "backup", checkpoint=last, inference=inference)
    backup.set_model(training)
    backup.on_epoch_end(1)
    state = read_state(tmp_path / "backup")
    assert state.epoch == 2 and state.weights.name.endswith(".weights.h5") and state.state is None


@contextlib.contextmanager
def _tmpfs(mount: Path, options: str):
    """A tmpfs mounted at `mount` with `options` while the body runs; skips the test where mounting is refused."""
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(
    params=[pytest.param(("3m", 0), marks=pytest.mark.slow), pytest.param(("7m", 1), marks=pytest.mark.slow)],
    ids=["3MiB", "7MiB"],
)
def small_disk(tmp_path, request):
    """(a tmpfs, the epochs whose backup it holds at least). 7 MiB: room for epoch 1's checkpoints (2 x 1.4 MB:
    the inference model) and backup (a link to last.keras and Adam's state, 2.8 MB), not for all of epoch 2's.
    3 MiB: room for the checkpoints, and the disk fills while the backup is written (which crashed the process,
    SIGSEGV, when HDF5 wrote the weights to the disk itself)."""
    size, backed_up = request.param
    with _tmpfs(tmp_path / "disk", f"size={size}") as mount:
        yield mount, backed_up


@pytest.mark.e2e
def test_a_full_disk_is_one_line_and_resume_after_freeing_space_gives_every_epoch_once(tmp_path, small_disk):
    disk, backed_up = small_disk
    run_dir = disk / "run"
    full = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=3, model="vgg19"), process=True)
    assert full.returncode == 1, full.stderr[-2000:]
    assert "Traceback" not in full.stdout + full.stderr
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: cannot write {run_dir}/") and "No space left on device" in error
    assert error.endswith(f"Free space or fix permissions, then continue with: python run.py resume={run_dir}")
    committed = _backup_epoch(run_dir) if (run_dir / "backup" / METADATA).exists() else 0
    epochs = _epochs(run_dir)
    assert committed >= backed_up and epochs == list(range(1, len(epochs) + 1))
    assert len(epochs) - committed in (0, 1), "at most the failed epoch's row is beyond the committed backup"
    assert _temporaries(run_dir) == []
    for name in ("last.keras", "best.keras")[: 1 + bool(committed)]:  # an uncommitted best waits as pending
        keras.saving.load_model(run_dir / "checkpoints" / name)  # the earlier checkpoints stay loadable
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    _resume(tmp_path, run_dir)
    _assert_finished_once(run_dir, 3)


FILL_AND_SAVE = """
import os, sys, keras
from pathlib import Path
from trainer.errors import DiskError
from trainer.runs import backup
from trainer.runs.atomic import write_atomic

disk = Path(sys.argv[1])
model = keras.Sequential([keras.Input((400,)), keras.layers.Dense(400), keras.layers.Dense(400)])
model.compile(optimizer="adam", loss="mse")
model.optimizer.build(model.trainable_variables)  # weights + Adam's two moments: about 3.9 MB
for through_memory in (True, False):
    if not through_memory:
        backup._available_memory = lambda: 0  # a state too large for memory: HDF5 writes it, after a space check
    for free_kib in (0, 16, 256, 1024, 2048, 3000, 3900, 7000):
        filler = disk / "filler"
        with open(filler, "wb") as handle:
            handle.write(bytes(max(0, 8 * 1024 * 1024 - free_kib * 1024)))
        try:
            write_atomic(disk / "state.weights.h5", lambda path: backup.save_weights(model, path))
            outcome = "written"
        except DiskError as error:
            outcome = str(error)
        print(f"{through_memory} {free_kib} {outcome}", flush=True)
        filler.unlink()
        (disk / "state.weights.h5").unlink(missing_ok=True)
"""


@pytest.mark.integration
def test_a_backup_that_the_disk_cannot_hold_is_one_disk_error_at_every_size(tmp_path):
    with _tmpfs(tmp_path / "disk", "size=8m") as disk:
        result = subprocess.run(
            [sys.executable, "-c", FILL_AND_SAVE, str(disk)], env=ENV, capture_output=True, text=True, timeout=300
        )
        left = sorted(path.name for path in disk.iterdir())
    assert result.returncode == 0, result.stderr[-3000:]  # HDF5 writing to a full disk itself: SIGSEGV
    assert "Traceback" not in result.stderr
    outcomes = [line.split(" ", 2) for line in result.stdout.splitlines()]
    assert len(outcomes) == 16 and left == []
    for through_memory, free_kib, outcome in outcomes:
        assert outcome == "written" or (
            outcome.startswith(f"cannot write {disk}/state.weights.h5: No space left on device")
            and outcome.endswith("; the previous file is unchanged")
        ), (through_memory, free_kib, outcome)
    written = [(through_memory, free_kib) for through_memory, free_kib, outcome in outcomes if outcome == "written"]
    assert ("True", "7000") in written and ("False", "7000") in written  # room for it, both ways


@pytest.mark.integration
def test_a_read_only_place_for_the_run_folder_is_one_line(tmp_path):
    with _tmpfs(tmp_path / "readonly", "ro,size=1m") as mount:
        for arguments, cwd, folder in (
            ([f"hydra.run.dir={mount}/run"], tmp_path, mount),
            ([], mount, mount),  # the default outputs/ in a read-only working folder
        ):
            outcome = run_cli(["trainer.epochs=1", *arguments], cwd=cwd)
            assert outcome.returncode == 1 and "Traceback" not in outcome.stderr
            assert outcome.stderr.strip().splitlines()[-1] == (
                f"error: cannot create the run folder in {folder} (Read-only file system); "
                f"set hydra.run.dir=A_WRITABLE_FOLDER"
            )


@pytest.mark.unit
def test_an_unwritable_file_is_a_disk_error_and_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    write_json(path, {"a": 1})

    def full(temporary):
        raise OSError(28, "No space left on device")

    with pytest.raises(DiskError, match=rf"cannot write {path}: No space left on device; the previous file"):
        write_atomic(path, full)
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


# --- files the team can read ---------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_json(tmp_path / "metrics.json", {"a": 1})
        write_atomic(tmp_path / "last.keras", _backup_model().save)
    finally:
        os.umask(previous)
    assert {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()} == {
        "metrics.json": mode,
        "last.keras": mode,
    }


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


@contextlib.contextmanager
def _held_by_another_process(folder: Path):
    """`folder`'s lock held by a live process (as a training run holds it) while the body runs."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from trainer.runs.locks import run_lock\n"
         "with run_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)", str(folder)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


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


# --- resume is bound to the run's config --------------------------------------------------------------


@pytest.mark.integration
def test_a_new_run_never_reuses_a_folder_that_holds_a_run(tmp_path):
    run_dir = tmp_path / "run"
    arguments = _train_arguments(tmp_path, run_dir, epochs=1)
    assert _run(tmp_path, arguments).returncode == 0
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    again = _run(tmp_path, [*arguments, "seed=2", "model.dropout=0.5"])
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: hydra.run.dir={run_dir} holds a training run already (history.csv, checkpoints, metrics.json): "
        f"a new run never reuses its folder. Choose a new folder, or continue that run with resume={run_dir}"
    )
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before, "nothing rewritten"


@pytest.mark.integration
def test_a_new_run_never_rewrites_the_config_of_a_run_in_its_first_epoch(tmp_path):
    """A running training holds its folder's lock before any history.csv exists: Hydra must not get to rewrite
    its `.hydra/config.yaml` for a second command that is then refused."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")
    with _held_by_another_process(run_dir):  # the first run, in its first epoch: it holds the lock
        again = _run(tmp_path, [*_train_arguments(tmp_path, run_dir, epochs=1), "seed=2", "model.dropout=0.5"])
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: hydra.run.dir={run_dir} is in use by a running training (its .lock is held): a new run never "
        f"reuses its folder. Choose a new folder"
    )
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 1\n", "the running run's config is kept"
    assert not (run_dir / "config_tree.txt").exists()


@pytest.mark.integration
def test_resume_with_another_run_folder_is_one_line_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=1)).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    result = _run(tmp_path, [f"resume={run_dir}", f"hydra.run.dir={elsewhere}"])
    assert result.returncode == 1 and not elsewhere.exists()
    assert f"error: resume={run_dir} writes into the resumed run's own folder; drop hydra.run.dir={elsewhere}" in (
        result.stderr
    )


@pytest.fixture
def saved_run(tmp_path) -> Path:
    """A run folder with the saved config of a CIFAR run, as Hydra writes it (`.hydra/config.yaml`, the composed
    config without Hydra's own section): the config is all these tests need."""
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    arguments = [item for item in _train_arguments(tmp_path, run_dir, epochs=3, model="vgg19") if "hydra." not in item]
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(arguments, run_dir), run_dir / ".hydra" / "config.yaml")
    return run_dir


CHANGED_EXPERIMENTS = [
    (["dataset=digits"], "dataset.name: 'cifar' -> 'digits'"),
    (["optimizer=sgd"], "optimizer.name: 'adam' -> 'sgd'"),
    (["model.width_multiplier=0.25"], "model.width_multiplier: 0.125 -> 0.25"),
    (["trainer.batch_size=16", "seed=1"], "seed: 42 -> 1; trainer.batch_size: 8 -> 16"),
    (["trainer.precision=mixed_bfloat16"], "trainer.precision: 'float32' -> 'mixed_bfloat16'"),
    (["strategy=mirrored"], "strategy.name: 'single' -> 'mirrored'"),
    (["trainer.epochs=2"], "trainer.epochs: 3 -> 2"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("overrides", "expected"), CHANGED_EXPERIMENTS)
def test_resume_refuses_a_command_line_that_changes_the_experiment(saved_run, overrides, expected):
    from conftest import compose
    from trainer.tasks import run_task

    cli = [f"resume={saved_run}", *overrides]
    with pytest.raises(ConfigError) as error:
        run_task(compose(cli, saved_run), overrides=cli)
    message = str(error.value)
    assert "\n" not in message and expected in message
    assert message.startswith(f"resume={saved_run} continues {saved_run} with its own config")


@pytest.mark.integration
def test_resume_alone_takes_the_run_config_and_allows_safe_changes(saved_run, caplog):
    from conftest import compose
    from trainer.config.resume import bind_to_run

    cli = [f"resume={saved_run}", "trainer.epochs=5", "trainer.verbose=1", "trainer.threads=1"]
    with caplog.at_level("INFO"):
        bound = bind_to_run(compose(cli, saved_run), saved_run, cli)
    assert bound.dataset.name == "cifar" and bound.trainer.batch_size == 8 and bound.model.width_multiplier == 0.125
    assert (bound.trainer.epochs, bound.trainer.verbose, bound.trainer.threads) == (5, 1, 1)
    assert "Resume with a changed setting (allowed): trainer.epochs: 3 -> 5" in caplog.text


@pytest.mark.integration
def test_run_py_resume_with_another_optimizer_is_one_line(tmp_path, saved_run):
    result = _run(tmp_path, [f"resume={saved_run}", "optimizer=sgd"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: resume={saved_run} continues {saved_run} with its own config")
    assert "optimizer.name: 'adam' -> 'sgd'" in error and error.endswith("Drop these overrides, or start a new run")


@pytest.mark.integration
def test_resume_of_a_folder_that_is_no_run_is_one_line_and_makes_no_folder(tmp_path):
    result = _run(tmp_path, [f"resume={tmp_path / 'nothere'}"])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: resume={tmp_path / 'nothere'}: not a training run folder (no .hydra/config.yaml, history.csv or "
        "backup/)"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == [], "no dated folder is left"


def _two_backed_up_runs(root: Path) -> None:
    """outputs/2026-11-30/10-00-00, whose backup was written last, and 11-00-00, made later but backed up first."""
    for name, written in (("2026-11-30/10-00-00", 200), ("2026-11-30/11-00-00", 100)):
        metadata = root / "outputs" / name / "backup" / METADATA
        metadata.parent.mkdir(parents=True)
        metadata.write_text('{"epoch": 1}')
        os.utime(metadata, (written, written))


@pytest.mark.unit
def test_resume_latest_picks_the_run_whose_backup_was_written_last(tmp_path, monkeypatch):
    from trainer.runs.folders import resume_folder

    monkeypatch.chdir(tmp_path)
    _two_backed_up_runs(tmp_path)
    assert resume_folder("latest") == str(Path("outputs") / "2026-11-30" / "10-00-00")


@pytest.mark.e2e
def test_a_resume_on_other_data_is_refused_and_a_moved_copy_passes(tmp_path):
    run_dir = tmp_path / "run"
    stopped = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2), _signal_in_first_step(signal.SIGTERM))
    assert stopped.returncode == 0 and (run_dir / "data.json").is_file()
    shifted = write_cifar(tmp_path / "shifted")  # the same names, sizes and counts, every label + 1
    for path in shifted.glob("*.bin"):
        records = np.frombuffer(path.read_bytes(), np.uint8).reshape(-1, 3073).copy()
        records[:, 0] = (records[:, 0] + 1) % 10
        path.write_bytes(records.tobytes())
    refused = _run(tmp_path, [f"resume={run_dir}", f"dataset.data_dir={shifted}"])
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: the data differs from what {run_dir} trained on (test: test_batch.bin has other "
        f"content); point dataset.data_dir at that data, or continue on this data with allow_data_change=true"
    )
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "cifar", moved)
    shutil.rmtree(tmp_path / "cifar")
    _resume(tmp_path, run_dir, f"dataset.data_dir={moved}")  # the same data in another folder
    _assert_finished_once(run_dir, 2)


@pytest.mark.e2e
def test_a_resume_finds_a_changed_byte_that_the_sampled_checksum_never_reads(tmp_path):
    """The sampled checksum reads 3 x 64 KiB a file; the first epoch's whole-file checksum finds the rest."""
    data = write_cifar(tmp_path / "cifar", records_per_file=200)  # 614,600 bytes a file
    run_dir = tmp_path / "run"
    arguments = [*tiny_overrides(data), "trainer.epochs=2", f"hydra.run.dir={run_dir}"]
    killed = _run(tmp_path, arguments, _kill_in_write("trainer.runs.backup", METADATA, 2))  # in epoch 2's commit
    assert killed.returncode == -signal.SIGKILL and _backup_epoch(run_dir) == 1
    recorded = json.loads((run_dir / "data.json").read_text())["sha256"]
    assert [name for name, _, _ in recorded] == [*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"]
    batch = data / "data_batch_1.bin"
    original = batch.read_bytes()
    records = np.frombuffer(original, np.uint8).reshape(-1, 3073).copy()
    records[40:80, 1:] = 255 - records[40:80, 1:]  # pixels of records 40-79: bytes 122,920 to 245,839
    batch.write_bytes(records.tobytes())
    refused = _run(tmp_path, [f"resume={run_dir}"])
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: data_batch_1.bin has other content than the run trained on (its whole-file "
        f"checksum differs); point dataset.data_dir at that data, or continue on this data with allow_data_change=true"
    )
    assert _epochs(run_dir) == [1] and _backup_epoch(run_dir) == 1, "the resumed epoch was not committed"
    batch.write_bytes(original)
    (run_dir / "data.json").rename(tmp_path / "data.json")
    missing = _run(tmp_path, [f"resume={run_dir}"])
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: {run_dir / 'data.json'} is missing or unreadable, so the data cannot be checked "
        f"against what the run trained on; continue on this data knowingly with allow_data_change=true"
    )
    (tmp_path / "data.json").rename(run_dir / "data.json")
    _resume(tmp_path, run_dir)
    _assert_finished_once(run_dir, 2)


@pytest.mark.integration
def test_resume_latest_skips_a_run_that_a_live_process_is_training(tmp_path, monkeypatch, caplog):
    from trainer.runs.folders import resume_folder

    monkeypatch.chdir(tmp_path)
    _two_backed_up_runs(tmp_path)
    newest = tmp_path / "outputs" / "2026-11-30" / "10-00-00"
    with _held_by_another_process(newest):  # another process trains the newest run: it holds its lock
        with caplog.at_level("INFO"):
            assert resume_folder("latest") == str(Path("outputs") / "2026-11-30" / "11-00-00")
        assert "skipping outputs/2026-11-30/10-00-00, which a live process is training" in caplog.text
    assert resume_folder("latest") == str(Path("outputs") / "2026-11-30" / "10-00-00"), "a dead holder holds nothing"


# --- no collisions: the real thing (several trainings at once) -----------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_two_trainings_with_one_folder_name_get_two_folders(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    same_second = 'hydra.run.dir="${worker_dir:outputs/same-second,${resume}}"'  # two runs at 12:00:00 resolve that
    command = [sys.executable, str(ROOT / "run.py"), *cifar_overrides(data), same_second]
    processes = [
        subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors
    folders = sorted(path.name for path in (tmp_path / "outputs").iterdir())
    assert folders == ["same-second", "same-second-2"]
    for name in folders:
        assert _epochs(tmp_path / "outputs" / name) == [1]
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
    killed = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2), _signal_in_first_step(signal.SIGKILL))
    assert killed.returncode == -signal.SIGKILL
    go = tmp_path / "go"
    script = SCRIPT.format(root=str(ROOT), patch=HOLD_IN_FIRST_STEP.format(go=str(go)), arguments=[f"resume={run_dir}"])
    first = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        while not (run_dir / ".lock").read_text().startswith(f'{{"pid": {first.pid},'):
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.2)
        second = _run(tmp_path, [f"resume={run_dir}"])
    finally:
        go.touch()
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert second.returncode == 1
    assert (
        second.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {run_dir} is in use by process {first.pid} on host {socket.gethostname()} (since ")
    )
    _assert_finished_once(run_dir, 2)


@pytest.fixture
def unwritable_checkpoints(tmp_path):
    """RUN/checkpoints that refuses writes: a read-only tmpfs as root (root ignores modes), else mode 0555."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64m", "tmpfs", str(folder)]).returncode == 0
    if not mounted:
        folder.chmod(0o555)
    try:
        (folder / "probe").write_text("x")
    except OSError:
        pass
    else:
        pytest.skip("cannot make a folder unwritable here")
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)
        else:
            folder.chmod(0o755)


@pytest.mark.e2e
@pytest.mark.slow
def test_unwritable_checkpoints_is_one_line_and_resume_once_writable_gives_every_epoch_once(
    tmp_path, unwritable_checkpoints
):
    run_dir = unwritable_checkpoints.parent
    failed = _run(tmp_path, _train_arguments(tmp_path, run_dir, epochs=2, model="vgg19"), process=True)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: cannot write {unwritable_checkpoints}/last.keras: ")
    assert error.endswith(f"Free space or fix permissions, then continue with: python run.py resume={run_dir}")
    assert _epochs(run_dir) == [] and not (run_dir / "backup" / METADATA).exists()
    if subprocess.run(["mount", "-o", "remount,rw", str(unwritable_checkpoints)]).returncode != 0:
        unwritable_checkpoints.chmod(0o755)
    _resume(tmp_path, run_dir)
    _assert_finished_once(run_dir, 2)
