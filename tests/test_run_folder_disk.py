"""A full disk, a read-only place, unwritable checkpoints: one line; a resume once writable gives every epoch once."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from conftest import (
    SUBPROCESS_ENV,
    assert_finished_once,
    backup_epoch,
    history_epochs,
    resume_run,
    run_cli,
    run_patched,
    temporaries,
    train_arguments,
)
from trainer.errors import DiskError
from trainer.runs.atomic import write_atomic, write_json
from trainer.runs.backup import METADATA


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
    full = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=3, model="vgg19"), process=True)
    assert full.returncode == 1, full.stderr[-2000:]
    assert "Traceback" not in full.stdout + full.stderr
    error = full.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: cannot write {run_dir}/") and "No space left on device" in error
    assert error.endswith(f"Free space or fix permissions, then continue with: python run.py resume={run_dir}")
    committed = backup_epoch(run_dir) if (run_dir / "backup" / METADATA).exists() else 0
    epochs = history_epochs(run_dir)
    assert committed >= backed_up and epochs == list(range(1, len(epochs) + 1))
    assert len(epochs) - committed in (0, 1), "at most the failed epoch's row is beyond the committed backup"
    assert temporaries(run_dir) == []
    for name in ("last.keras", "best.keras")[: 1 + bool(committed)]:  # an uncommitted best waits as pending
        keras.saving.load_model(run_dir / "checkpoints" / name)  # the earlier checkpoints stay loadable
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    resume_run(tmp_path, run_dir)
    assert_finished_once(run_dir, 3)


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
@pytest.mark.slow  # 13 s, and root only; tests/test_run_folder_faults.py fills the disk in each file without root
def test_a_backup_that_the_disk_cannot_hold_is_one_disk_error_at_every_size(tmp_path):
    with _tmpfs(tmp_path / "disk", "size=8m") as disk:
        result = subprocess.run(
            [sys.executable, "-c", FILL_AND_SAVE, str(disk)],
            env=SUBPROCESS_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        left = sorted(path.name for path in disk.iterdir())
    assert result.returncode == 0, result.stderr[-3000:]  # HDF5 writing to a full disk itself: SIGSEGV
    assert "Traceback" not in result.stderr
    outcomes = [line.split(" ", 2) for line in result.stdout.splitlines()]
    assert len(outcomes) == 16 and left == []
    for through_memory, free_kib, outcome in outcomes:
        assert outcome == "written" or (
            outcome.startswith(f"cannot write {disk}/state.weights.h5: No space left on device")
            and "previous file" not in outcome  # there was none to keep
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
    failed = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2, model="vgg19"), process=True)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: cannot write {unwritable_checkpoints}/last.keras: ")
    assert error.endswith(f"Free space or fix permissions, then continue with: python run.py resume={run_dir}")
    assert history_epochs(run_dir) == [] and not (run_dir / "backup" / METADATA).exists()
    if subprocess.run(["mount", "-o", "remount,rw", str(unwritable_checkpoints)]).returncode != 0:
        unwritable_checkpoints.chmod(0o755)
    resume_run(tmp_path, run_dir)
    assert_finished_once(run_dir, 2)
