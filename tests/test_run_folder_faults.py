"""A full disk, without root: each file of the run folder in turn fills the disk at a chosen byte (`faults.py`).

Each case must end in one `error:` line naming a file of the run folder (no traceback, no "Logging error"),
leave no temporary file, leave the previous version of the failing file as it was and no more than the failing
epoch beyond the committed backup; then the command the line names (the resume, or the same command where
nothing was kept) finishes every epoch once. tests/test_run_folder_disk.py keeps the mounted tmpfs cases, for
what only a real disk shows (TensorFlow's C++ event writer, HDF5 writing to the disk itself).
"""

from __future__ import annotations

import fnmatch

import pytest

from conftest import assert_finished_once, backup_epoch, history_epochs, run_cli, temporaries, train_arguments
from faults import DiskFull, logical_name
from trainer.runs.backup import METADATA
from trainer.tracking.curves import wait_for_drawings

EPOCHS = 2
HINT = "Free space or fix permissions, then continue with: python run.py resume="

# (the file, which of its openings for writing fills the disk): the last writing of each file, so a file written
# every epoch fails in epoch 2 (a full disk costs at most that epoch). `checkpoints/*.keras` open twice a save.
LAST = [
    (".hydra/config.yaml", 1),  # Hydra writes .hydra/ before any code of ours runs
    (".hydra/hydra.yaml", 1),
    (".hydra/overrides.yaml", 1),
    ("run.log", 1),  # the log: one warning, then the next file written fails
    ("config_tree.txt", 1),  # before the run folder is held: nothing to resume, the same command again
    ("data.json", 2),
    ("history.csv", 2),
    ("curves.png", 2),  # drawn in a background thread
    ("checkpoints/last.keras", 4),
    ("checkpoints/best.pending-*.keras", 1),
    ("backup/*.state.npz", 2),
    ("backup/training_metadata.json", 2),
    ("backup/training_metadata.json.bkp", 1),
    ("confusion_matrix_test.csv", 1),
    ("confusion_matrix_test.png", 1),
    ("report/per_class.csv", 1),  # the report: written in a temporary folder, renamed once complete
    ("report/mistakes.png", 1),
    ("report/borderline.png", 1),
    ("report/calibration.png", 1),
    ("report/confusion_matrix.png", 1),  # a copy (os.sendfile)
    ("report/report.html", 1),
    ("metrics.json", 1),
    ("invocations.jsonl", 2),  # the end line, after metrics.json: the run is finished, one warning
]
FIRST = [  # the epoch-1 writing of the files written every epoch
    ("invocations.jsonl", 1),
    ("data.json", 1),
    ("history.csv", 1),
    ("curves.png", 1),
    ("checkpoints/last.keras", 1),
    ("checkpoints/last.keras", 2),
    ("checkpoints/last.keras", 3),
    ("backup/*.state.npz", 1),
    ("backup/training_metadata.json", 1),
]
DEFAULT = {  # the default suite: one of each kind of writer (the slow tier runs every file, and
    # test_every_file_of_the_run_folder_has_its_full_disk_case checks the list in the default suite)
    ".hydra/config.yaml",  # Hydra's, before the run folder is held: the same command again
    "run.log",  # logging's: one warning, then the next file fails
    "checkpoints/last.keras",  # Keras's zip, in epoch 2: the resume redoes that epoch only
    "report/mistakes.png",  # a temporary folder, after training
}
NOT_BY_PYTHON = ("tensorboard/*/events.out.tfevents.*", ".lock")  # TensorFlow's C++ writer; a lock holds no bytes
RENAMED = {"checkpoints/best.keras": "checkpoints/best.pending-*.keras"}  # written under one name, kept under another


def _arguments(tmp_path, run_dir):
    """A tiny run of two epochs, with the evaluation report that training writes by default."""
    return [*train_arguments(tmp_path, run_dir, EPOCHS), "evaluate.report=true"]


def _cases():
    for name, write in LAST:
        for at_byte in (16, 0):  # a part of the file written; nothing of it
            slow = name not in DEFAULT or at_byte == 0
            yield pytest.param(
                name, write, at_byte, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{write}@{at_byte}"
            )
    for name, write in FIRST:
        yield pytest.param(name, write, 16, marks=[pytest.mark.slow], id=f"{name}-{write}@16")


@pytest.mark.integration
def test_every_file_of_the_run_folder_has_its_full_disk_case(tmp_path):
    """A file the run starts writing fails this test until LAST names it (or NOT_BY_PYTHON says why not)."""
    run_dir = tmp_path / "run"
    with DiskFull(run_dir) as disk:
        assert run_cli(_arguments(tmp_path, run_dir), cwd=tmp_path).returncode == 0
    assert dict(disk.opened) == {name: write for name, write in LAST}

    left = {RENAMED.get(name, name) for name in (logical_name(p, run_dir) for p in run_dir.rglob("*") if p.is_file())}
    unknown = {
        name for name in left if not any(fnmatch.fnmatch(name, known) for known in (*disk.opened, *NOT_BY_PYTHON))
    }
    assert unknown == set()


@pytest.mark.integration
@pytest.mark.parametrize(("name", "write", "at_byte"), _cases())
def test_a_disk_that_fills_in_any_file_is_one_line_and_loses_at_most_the_epoch(tmp_path, name, write, at_byte):
    run_dir = tmp_path / "run"
    arguments = _arguments(tmp_path, run_dir)
    with DiskFull(run_dir, name, write, at_byte) as disk:
        full = run_cli(arguments, cwd=tmp_path)
        wait_for_drawings()  # python run.py waits for curves.png's thread before it exits
    assert disk.hit is not None, f"{name} was not opened for writing {write} times"
    output = full.stdout + full.stderr
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    lines = full.stderr.strip().splitlines()
    if name == "invocations.jsonl" and write == 2:  # everything else is written: the run finished
        assert full.returncode == 0 and "warning: cannot write" in full.stderr
        assert_finished_once(run_dir, EPOCHS)
        return
    assert full.returncode == 1, output[-3000:]
    error = lines[-1]
    assert error.startswith(f"error: cannot write {run_dir}/") and "No space left on device" in error, error
    if run_dir.exists():
        assert temporaries(run_dir) == []
        _assert_nothing_written_is_lost(run_dir, name, disk)
    again = [f"resume={run_dir}"] if HINT in error else arguments
    if HINT in error:
        assert error.endswith(f"{HINT}{run_dir}")
    finished = run_cli(again, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_finished_once(run_dir, EPOCHS)


def _assert_nothing_written_is_lost(run_dir, name, disk: DiskFull) -> None:
    """The failing file keeps its previous content (an appended file: as a prefix); history.csv holds at most
    the failing epoch beyond the backup's committed epoch."""
    if disk.before is not None:
        now = (run_dir / name).read_bytes()
        kept = now.startswith(disk.before) if name in ("run.log", "invocations.jsonl") else now == disk.before
        assert kept, f"{name} lost what it held before the disk filled"
    epochs = history_epochs(run_dir)
    assert epochs == list(range(1, len(epochs) + 1))
    committed = backup_epoch(run_dir) if (run_dir / "backup" / METADATA).exists() else 0
    assert len(epochs) - committed in (0, 1), f"history.csv has {epochs}, the backup committed epoch {committed}"


# mode=evaluate writes a run folder of its own (the trained run is only read): each of its files in turn.
EVALUATE_FILES = [
    ".hydra/config.yaml",
    "run.log",
    "config_tree.txt",
    "confusion_matrix_test.csv",
    "confusion_matrix_test.png",
    "report/per_class.csv",
    "report/report.html",
    "metrics.json",
]


@pytest.mark.integration
@pytest.mark.slow  # 8 evaluations; the writers are the training run's, whose cases run in the default suite
@pytest.mark.parametrize("name", EVALUATE_FILES)
def test_a_disk_that_fills_in_an_evaluations_folder_is_one_line_and_the_same_command_works_again(
    tmp_path, trained_run, name
):
    _, run = trained_run
    folder = tmp_path / "evaluation"
    arguments = ["mode=evaluate", f"checkpoint={run}", f"hydra.run.dir={folder}"]
    with DiskFull(folder, name, 1, 16) as disk:
        full = run_cli(arguments, cwd=tmp_path)
    assert disk.hit is not None, f"{name} was not written"
    output = full.stdout + full.stderr
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    assert full.returncode == 1 and full.stderr.strip().splitlines()[-1].startswith(f"error: cannot write {folder}/")
    assert not folder.exists() or temporaries(folder) == []
    again = run_cli(arguments, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (folder / "metrics.json").is_file() and (folder / "report" / "report.html").is_file()


@pytest.mark.integration
@pytest.mark.slow  # an export and its checks, 10 s
def test_a_disk_that_fills_while_exporting_is_one_line_and_leaves_no_export(tmp_path, trained_run):
    _, run = trained_run
    target = tmp_path / "exports" / "pets"
    arguments = ["mode=export", f"checkpoint={run}", f"export.dir={target}", f"hydra.run.dir={tmp_path / 'run'}"]
    with DiskFull(target.parent, ".pets-*/serving_info.json", 1, 16) as disk:
        full = run_cli(arguments, cwd=tmp_path)
    assert disk.hit is not None
    output = full.stdout + full.stderr
    assert "Traceback" not in output and full.returncode == 1, output[-3000:]
    assert (
        full.stderr.strip().splitlines()[-1] == f"error: export.dir={target}: cannot write it: No space left on device"
    )
    assert list(target.parent.iterdir()) == [], "no export and no temporary folder"


@pytest.mark.integration
def test_another_job_logging_replaces_run_logs_handler_whole(tmp_path):
    """run.log's handler is a Hydra job_logging option of its own (conf/hydra/job_logging/run_log.yaml), so
    `hydra/job_logging=disabled` takes its place instead of leaving it a handler with no file to write."""
    run_dir = tmp_path / "run"
    result = run_cli(["hydra/job_logging=disabled", *train_arguments(tmp_path, run_dir, 1)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "metrics.json").is_file() and not (run_dir / "run.log").exists()
