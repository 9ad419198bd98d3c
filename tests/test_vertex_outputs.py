"""Vertex AI's output folders: AIP_TENSORBOARD_LOG_DIR, AIP_CHECKPOINT_DIR and AIP_MODEL_DIR, through tf.io.gfile.

Each folder is given as a `file://` URL, the local stand-in of the `gs://` ones Vertex AI sets: both go through
tf.io.gfile only, never through Path (which makes `gs:/b/x` of `gs://b/x`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import SUBPROCESS_ENV, assert_finished_once, run_cli, run_patched, train_arguments
from trainer.errors import DiskError
from trainer.runs import storage
from trainer.runs.backup import METADATA, PREVIOUS


def _vertex(monkeypatch, root: Path, *names: str) -> dict[str, Path]:
    """Sets the AIP_* folders `names` (model, checkpoints, tensorboard) as file:// URLs under `root`, for this
    process and the test's own; returns their local paths."""
    local = {}
    for name in names:
        local[name] = root / "vertex" / name
        monkeypatch.setenv(storage.VARIABLES[name], f"file://{local[name]}")
        monkeypatch.setitem(SUBPROCESS_ENV, storage.VARIABLES[name], f"file://{local[name]}")
    return local


def _events(folder: Path) -> list[str]:
    """The TensorBoard runs (sub-folders) that hold event files."""
    return sorted({path.parent.name for path in folder.rglob("events.out.tfevents.*")})


@pytest.mark.unit
def test_a_folder_joins_as_a_url_or_a_path():
    assert storage.join("gs://bucket/job/logs", "train") == "gs://bucket/job/logs/train"
    assert storage.join("gs://bucket/job/", "backup", "a.keras") == "gs://bucket/job/backup/a.keras"
    assert storage.join("file:///tmp/x", "y") == "file:///tmp/x/y"
    assert storage.join(Path("/tmp/x"), "y") == os.path.join("/tmp/x", "y")


@pytest.mark.unit
def test_the_folders_are_read_from_vertex_ais_variables_and_empty_ones_are_not_set():
    environ = {"AIP_MODEL_DIR": "gs://b/j/model", "AIP_CHECKPOINT_DIR": "", "AIP_TENSORBOARD_LOG_DIR": "gs://b/j/l"}
    outputs = storage.OutputFolders.from_environment(environ)
    assert outputs == storage.OutputFolders(model="gs://b/j/model", tensorboard="gs://b/j/l")
    assert outputs.given() == {"AIP_MODEL_DIR": "gs://b/j/model", "AIP_TENSORBOARD_LOG_DIR": "gs://b/j/l"}
    assert storage.OutputFolders.from_environment({}).given() == {}


@pytest.mark.unit
def test_a_folder_that_cannot_be_written_is_one_line_naming_its_variable(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(DiskError, match=r"^AIP_CHECKPOINT_DIR=file://.*a_file/sub: cannot be written \(.+\)$"):
        storage.check_writable(f"file://{tmp_path / 'a_file' / 'sub'}", "AIP_CHECKPOINT_DIR")
    storage.check_writable(f"file://{tmp_path / 'new' / 'folder'}", "AIP_MODEL_DIR")
    assert (tmp_path / "new" / "folder").is_dir() and list((tmp_path / "new" / "folder").iterdir()) == []


@pytest.mark.unit
def test_a_mirrored_backup_copies_its_metadata_last_and_drops_what_the_backup_dropped(tmp_path, monkeypatch):
    source, mirror = tmp_path / "backup", tmp_path / "mirror"
    source.mkdir()
    for name in ("epoch00002-step000000-aa.keras", METADATA, PREVIOUS, "epoch00001-step000000-bb.keras"):
        (source / name).write_bytes(name.encode())
    (source / f".{METADATA}.tmp-1234abcd.json").write_text("a write in progress")
    order, copy = [], tf.io.gfile.copy
    monkeypatch.setattr(
        tf.io.gfile, "copy", lambda a, b, overwrite: (order.append(Path(a).name), copy(a, b, overwrite))
    )
    copied: dict = {}
    storage.sync_folder(source, f"file://{mirror}", copied)
    assert order[-2:] == [PREVIOUS, METADATA], "the commit is copied after the files it names"
    assert sorted(path.name for path in mirror.iterdir()) == sorted(path.name for path in source.iterdir())[1:]
    order.clear()
    (source / "epoch00001-step000000-bb.keras").unlink()
    (source / METADATA).write_text("epoch 3")
    storage.sync_folder(source, f"file://{mirror}", copied)
    assert order == [METADATA], "unchanged files are not copied again"
    assert not (mirror / "epoch00001-step000000-bb.keras").exists()
    assert (mirror / METADATA).read_text() == "epoch 3"


@pytest.mark.unit
def test_a_backup_is_restored_from_its_mirror_only_where_the_folder_lost_it(tmp_path):
    mirror, backup = tmp_path / "mirror", tmp_path / "run" / "backup"
    mirror.mkdir()
    (mirror / "epoch00001-step000000-aa.keras").write_bytes(b"weights")
    (mirror / METADATA).write_text('{"epoch": 1}')
    assert storage.restore_mirror(f"file://{mirror}", backup)
    assert (backup / METADATA).read_text() == '{"epoch": 1}' and (backup / "epoch00001-step000000-aa.keras").is_file()
    (backup / METADATA).write_text('{"epoch": 2}')
    assert not storage.restore_mirror(f"file://{mirror}", backup), "a folder's own backup wins over the copy"
    assert (backup / METADATA).read_text() == '{"epoch": 2}'
    assert not storage.restore_mirror(f"file://{tmp_path / 'empty'}", tmp_path / "other" / "backup")


@pytest.mark.e2e
def test_a_run_on_vertex_ai_writes_tensorboard_checkpoints_and_the_savedmodel_to_its_folders(tmp_path, monkeypatch):
    """The three folders as Vertex AI sets them: TensorBoard (turned on by its folder) writes there only, the
    checkpoints are copied there (the backup too, until the run's results are written), and the checked
    SavedModel ends at the model folder's top; mode=export then refuses to overwrite it."""
    local = _vertex(monkeypatch, tmp_path, "model", "checkpoints", "tensorboard")
    run_dir = tmp_path / "run"
    result = run_cli(train_arguments(tmp_path, run_dir, epochs=2), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_finished_once(run_dir, 2)

    assert _events(local["tensorboard"]) == ["test", "train", "validation"] and not (run_dir / "tensorboard").exists()
    copy = local["checkpoints"] / "checkpoints" / "best.keras"
    assert copy.read_bytes() == (run_dir / "checkpoints" / "best.keras").read_bytes()
    assert not (local["checkpoints"] / "backup").exists(), "the copy of the backup goes with the backup"

    model_dir = local["model"]
    info = json.loads((model_dir / "serving_info.json").read_text())
    assert (model_dir / "saved_model.pb").is_file() and info["files"]["saved_model"]["path"] == "."
    serve = tf.saved_model.load(str(model_dir)).signatures["serve"]
    (probabilities,) = serve(images=tf.zeros([2, 32, 32, 3], tf.uint8)).values()
    assert probabilities.shape == (2, 10) and np.allclose(probabilities.numpy().sum(axis=1), 1, atol=1e-5)
    assert f"tensorboard --logdir file://{local['tensorboard']}" in result.stdout, "the summary names the folder"
    for line in ("TensorBoard's event files go to file://", "<AIP_MODEL_DIR>", "<AIP_CHECKPOINT_DIR>"):
        assert line in result.stdout

    again = run_cli(["mode=export", f"checkpoint={run_dir}"], cwd=tmp_path)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: AIP_MODEL_DIR=file://{model_dir}: holds a SavedModel already; nothing is overwritten"
    )


@pytest.mark.e2e
def test_a_vertex_ai_folder_that_cannot_be_written_stops_the_run_at_start_up(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", f"file://{tmp_path / 'a_file' / 'checkpoints'}")
    result = run_cli(train_arguments(tmp_path, tmp_path / "run", epochs=1), cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: AIP_CHECKPOINT_DIR=file://{tmp_path / 'a_file' / 'checkpoints'}: cannot be")
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "history.csv").exists()


SIGTERM_IN_EPOCH_2 = """
import trainer.training.callbacks as target
begin = target.EpochLog.on_epoch_begin
def on_epoch_begin(self, epoch, logs=None):
    begin(self, epoch, logs)
    if epoch == 1:
        os.kill(os.getpid(), signal.SIGTERM)
target.EpochLog.on_epoch_begin = on_epoch_begin
"""


@pytest.mark.e2e
@pytest.mark.slow  # a real process, preempted, then resumed (30 s); the default unit tests keep the restore's rule
def test_a_preempted_run_whose_folder_lost_its_backup_resumes_from_the_copy(tmp_path, monkeypatch):
    """SIGTERM in epoch 2: the stop's backup (epoch 1 done) is copied; the run folder loses its backup, and the
    resume goes on after epoch 1 from the copy, with every epoch once."""
    local = _vertex(monkeypatch, tmp_path, "checkpoints")
    run_dir = tmp_path / "run"
    arguments = train_arguments(tmp_path, run_dir, epochs=3)
    stopped = run_patched(tmp_path, arguments, SIGTERM_IN_EPOCH_2)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert (local["checkpoints"] / "backup" / METADATA).is_file(), "the stop's backup is copied"
    shutil.rmtree(run_dir / "backup")
    resumed = run_cli([f"resume={run_dir}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "held no backup: restored the copy in file://" in resumed.stdout
    assert f"Resuming {run_dir} after epoch 1 from " in resumed.stdout
    assert_finished_once(run_dir, 3)
    assert not (local["checkpoints"] / "backup").exists()


@pytest.mark.unit
def test_tensorboards_folder_given_in_the_config_wins_over_vertex_ais():
    from conftest import compose
    from trainer.config import to_settings
    from trainer.tasks.train import tensorboard_dir

    vertex = storage.OutputFolders(tensorboard="gs://b/job/logs")
    chosen = to_settings(compose(["logger=tensorboard", "logger.tensorboard.log_dir=gs://b/mine"])).logger
    assert tensorboard_dir(chosen, "/runs/r", vertex) == "gs://b/mine"
    plain = to_settings(compose(["logger=tensorboard"])).logger
    assert tensorboard_dir(plain, "/runs/r", vertex) == "gs://b/job/logs"
    assert tensorboard_dir(plain, "/runs/r", storage.OutputFolders()) == os.path.join("/runs/r", "tensorboard")


@pytest.mark.e2e
@pytest.mark.slow  # two workers (25 s); the single-process test above has the folders' content
def test_only_the_chief_of_two_workers_writes_vertex_ais_folders(tmp_path, monkeypatch):
    """Both workers get the same AIP_* variables, as Vertex AI gives every replica: the chief's process alone
    writes the event files, the copies and the SavedModel; the other worker never creates a file there."""
    from conftest import launch_workers, tiny_overrides, write_cifar

    local = _vertex(monkeypatch, tmp_path, "model", "checkpoints", "tensorboard")
    arguments = [*tiny_overrides(write_cifar(tmp_path / "cifar")), "strategy=multi_worker", "trainer.epochs=2"]
    workers = launch_workers(arguments, tmp_path, env=SUBPROCESS_ENV)
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    writers = {path.name.split(".")[-3] for path in local["tensorboard"].rglob("events.out.tfevents.*")}
    assert writers == {str(workers[0].pid)}, "the event files are the chief's only"
    assert (local["model"] / "saved_model.pb").is_file() and (local["checkpoints"] / "checkpoints").is_dir()
    assert "<AIP_" not in outputs[1], "the other worker names none of the folders"


@pytest.mark.unit
def test_a_sweeps_job_writes_into_its_own_sub_folder_of_each():
    outputs = storage.OutputFolders(model="gs://b/j/model", tensorboard="gs://b/j/logs")
    assert outputs.within("3") == storage.OutputFolders(model="gs://b/j/model/3", tensorboard="gs://b/j/logs/3")


@pytest.mark.e2e
@pytest.mark.slow  # two jobs, each exported (35 s); the unit test above keeps the rule
def test_the_jobs_of_a_sweep_on_vertex_ai_each_get_their_own_folders(tmp_path, monkeypatch):
    local = _vertex(monkeypatch, tmp_path, "model", "tensorboard")
    overrides = train_arguments(tmp_path, tmp_path / "unused", epochs=1)[:-1]  # not hydra.run.dir
    result = run_cli(["-m", *overrides, "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert (local["model"] / job / "saved_model.pb").is_file()
        assert _events(local["tensorboard"] / job) == ["test", "train", "validation"]


@pytest.mark.integration
def test_a_model_folder_that_holds_a_savedmodel_stops_the_run_at_start_up(tmp_path, monkeypatch):
    """The docs say it is refused at start-up; it was refused after `Run finished`, the training spent."""
    local = _vertex(monkeypatch, tmp_path, "model")
    local["model"].mkdir(parents=True)
    (local["model"] / "saved_model.pb").write_bytes(b"an earlier model")
    result = run_cli(train_arguments(tmp_path, tmp_path / "run", epochs=1), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: AIP_MODEL_DIR=file://{local['model']}: holds a SavedModel already; nothing is overwritten"
    )
    assert not (tmp_path / "run" / "history.csv").exists(), "refused before training"
    assert (local["model"] / "saved_model.pb").read_bytes() == b"an earlier model"
