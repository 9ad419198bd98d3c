"""Resume is bound to the run's own config, folder and data; a new run never reuses a folder that holds a run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    ROOT,
    assert_finished_once,
    backup_epoch,
    compose,
    history_epochs,
    resume_run,
    run_cli,
    run_patched,
    signal_in_first_step,
    stop_after_steps,
    tf_config,
    tiny_overrides,
    train_arguments,
    write_cifar,
)
from trainer.errors import ConfigError
from trainer.runs.backup import METADATA
from trainer.runs.folders import check_run_dir_argument

# --- resume is bound to the run's config --------------------------------------------------------------


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


@pytest.mark.integration
def test_a_new_run_never_reuses_a_folder_that_holds_a_run(tmp_path):
    run_dir = tmp_path / "run"
    arguments = train_arguments(tmp_path, run_dir, epochs=1)
    assert run_patched(tmp_path, arguments).returncode == 0
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    again = run_patched(tmp_path, [*arguments, "seed=2", "model.dropout=0.5"])
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
        again = run_patched(tmp_path, [*train_arguments(tmp_path, run_dir, epochs=1), "seed=2", "model.dropout=0.5"])
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: hydra.run.dir={run_dir} is in use by a running training (its .lock is held): a new run never "
        f"reuses its folder. Choose a new folder"
    )
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 1\n", "the running run's config is kept"
    assert not (run_dir / "config_tree.txt").exists()


@pytest.mark.integration
def test_the_run_folder_is_locked_before_hydra_writes_into_it(tmp_path, monkeypatch):
    """The window before a starting run takes its own lock (imports, Hydra's composition): the folder is locked
    from the command line on, so a second command started then cannot have Hydra rewrite the first's config."""
    import trainer.tasks
    from trainer.runs import locks

    run_dir, seen = tmp_path / "run", {}

    def task(cfg, **_):
        seen["hydra_written"] = (run_dir / ".hydra" / "config.yaml").is_file()
        seen["locked"] = locks.is_held(run_dir)
        try:  # a second command's check, which runs before its Hydra writes anything
            check_run_dir_argument([*train_arguments(tmp_path, run_dir, epochs=1), "seed=2"])
        except ConfigError as error:
            seen["second"] = str(error)

    monkeypatch.setattr(trainer.tasks, "run_task", task)
    assert run_cli(train_arguments(tmp_path, run_dir, epochs=1), cwd=tmp_path).returncode == 0
    assert seen["hydra_written"] and seen["locked"], "locked while Hydra wrote .hydra/"
    assert seen.get("second") == (
        f"hydra.run.dir={run_dir} is in use by a running training (its .lock is held): a new run never "
        f"reuses its folder. Choose a new folder"
    )
    assert not run_dir.exists(), "the first command trained nothing: its folder goes, and its lock with it"


@pytest.mark.unit
def test_a_run_folder_given_as_an_interpolation_is_left_to_hydra(tmp_path, monkeypatch):
    """`hydra.run.dir=${worker_dir:...}` is resolved by Hydra (claimed per run): no folder of that literal name."""
    monkeypatch.chdir(tmp_path)
    check_run_dir_argument(["hydra.run.dir=${worker_dir:outputs/same-second,${resume}}"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
def test_a_command_hydra_refuses_leaves_no_locked_folder(tmp_path):
    from trainer.runs import locks

    run_dir = tmp_path / "run"
    result = run_cli(["trainer.epochs=abc", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode != 0
    assert not run_dir.exists() and not locks.is_held(run_dir)


@pytest.mark.unit
def test_a_worker_may_share_the_folder_its_chief_holds(tmp_path, monkeypatch):
    """TFJob and Slurm give every task one command: the chief holds `hydra.run.dir`, the others start anyway."""
    from trainer.runs import locks

    run_dir = tmp_path / "run"
    monkeypatch.setenv("TF_CONFIG", tf_config([1, 2], 0))
    check_run_dir_argument(["strategy=multi_worker", f"hydra.run.dir={run_dir}"])  # the chief claims it
    try:
        monkeypatch.setenv("TF_CONFIG", tf_config([1, 2], 1))
        check_run_dir_argument(["strategy=multi_worker", f"hydra.run.dir={run_dir}"])
        monkeypatch.delenv("TF_CONFIG")
        with pytest.raises(ConfigError, match="is in use by a running training"):
            check_run_dir_argument([f"hydra.run.dir={run_dir}"])  # another run of its own is refused
    finally:
        locks.release_claims()


def _stopped_before_its_first_epoch(tmp_path: Path) -> Path:
    """The folder of a run preempted before its first checkpoint (no training needed): its saved config, its
    run.log, invocations and printed config."""
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    config = compose(tiny_overrides(write_cifar(tmp_path / "cifar")), run_dir)
    OmegaConf.save(config, run_dir / ".hydra" / "config.yaml")
    (run_dir / "run.log").write_text("[2026-12-06 12:00:00,000][run][INFO] - Epoch 1/1\n")
    (run_dir / "invocations.jsonl").write_text(
        '{"event": "start", "time": "2026-12-06T12:00:00+00:00", "command": "run.py", "pid": 1}\n'
        '{"event": "end", "time": "2026-12-06T12:00:05+00:00", "outcome": "preempted", "pid": 1}\n'
    )
    (run_dir / "config_tree.txt").write_text("seed: 1\n")
    return run_dir


@pytest.mark.integration
def test_a_resume_of_a_folder_in_use_is_refused_before_it_reads_data_or_writes_anything(tmp_path, monkeypatch):
    """A resume took its folder's lock only after it had set up the data and built the model (minutes on big data),
    while Hydra logged its start-up into the run's run.log; meanwhile evaluate of that folder offered to resume it.
    The folder is locked from the command line on: a second `resume=RUN` is refused at once with the lock's one
    line and leaves every byte (run.log, invocations.jsonl, config_tree.txt, .lock), and evaluate says it trains."""
    import trainer.tasks.train
    from trainer.runs import locks

    run_dir, read = _stopped_before_its_first_epoch(tmp_path), []

    def plan_run(*arguments):
        read.append(arguments)
        raise RuntimeError("the data is read")

    monkeypatch.setattr(trainer.tasks.train, "plan_run", plan_run)
    with locks.run_lock(run_dir):  # the resume training it (the lock is taken through another open file)
        before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
        second = run_cli([f"resume={run_dir}"], cwd=tmp_path)
        after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
        evaluated = run_cli(["mode=evaluate", f"checkpoint={run_dir}"], cwd=tmp_path)
    assert second.returncode == 1
    assert (
        second.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {run_dir} is in use by process {os.getpid()} on host ")
    ), second.stderr[-2000:]
    assert not read, "the second resume set up its data before it found the folder in use"
    assert after == before, "the refused resume wrote into the folder"
    assert evaluated.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint={run_dir}: the run has saved no checkpoint yet (it is training: its .lock is held)"
    )


@pytest.mark.integration
def test_a_resume_refused_after_it_locked_the_folder_keeps_the_folder(tmp_path):
    """A resume locks its folder before Hydra starts; refused later (another experiment's setting), it lets go
    of the lock and leaves the folder, though it holds nothing but what Hydra and the lock write (a new folder's
    early lock removes such a folder)."""
    from trainer.runs import locks

    run_dir = _stopped_before_its_first_epoch(tmp_path)
    for name in ("config_tree.txt", "invocations.jsonl"):  # a run killed as it started (or of vggtrain 0.1)
        (run_dir / name).unlink()
    refused = run_cli([f"resume={run_dir}", "seed=7"], cwd=tmp_path)
    assert refused.returncode == 1
    assert "seed" in refused.stderr.strip().splitlines()[-1], refused.stderr[-2000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file(), "the resumed run's folder is kept"
    assert not locks.is_held(run_dir) and (run_dir / ".lock").read_text() == "", "released, naming nobody"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environment", "task_index", "chief"),
    [
        ({}, None, True),
        ({}, "1", False),
        ({"SLURM_PROCID": "1"}, None, False),
        ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'}, None, False),
        ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'}, None, True),
        ({"TF_CONFIG": "not json"}, None, True),
    ],
)
def test_only_a_possible_chief_locks_the_folder_before_hydra(monkeypatch, environment, task_index, chief):
    """Workers of one cluster may share `hydra.run.dir` (one shared disk): only the chief takes its lock."""
    from trainer.distribute.cluster import may_be_chief

    for name in ("TF_CONFIG", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert may_be_chief(task_index) is chief


@pytest.mark.integration
def test_resume_with_another_run_folder_is_one_line_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=1)).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    result = run_patched(tmp_path, [f"resume={run_dir}", f"hydra.run.dir={elsewhere}"])
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
    arguments = [item for item in train_arguments(tmp_path, run_dir, epochs=3, model="vgg19") if "hydra." not in item]
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(arguments, run_dir), run_dir / ".hydra" / "config.yaml")
    return run_dir


CHANGED_EXPERIMENTS = [
    (["dataset=digits"], "dataset.name: 'cifar' -> 'digits'"),
    (["optimizer=sgd"], "optimizer.name: 'adam' -> 'sgd'"),
    (["model.width_multiplier=0.25"], "model.width_multiplier: 0.125 -> 0.25"),
    (["trainer.batch_size=16", "seed=1"], "seed: 42 -> 1; trainer.batch_size: 8 -> 16"),
    (["trainer.precision=mixed_bfloat16"], "trainer.precision: 'auto' -> 'mixed_bfloat16'"),
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
    from trainer.config import to_settings
    from trainer.config.bind import bind_to_run

    cli = [f"resume={saved_run}", "trainer.epochs=5", "trainer.verbose=1", "trainer.threads=1"]
    with caplog.at_level("INFO"):
        bound = bind_to_run(compose(cli, saved_run), saved_run, cli)
    assert bound.dataset.name == "cifar" and bound.trainer.batch_size == 8 and bound.model.width_multiplier == 0.125
    trainer = to_settings(bound).trainer  # what the run trains with (trainer.verbose: a Choice until it is checked)
    assert (trainer.epochs, trainer.verbose, trainer.threads) == (5, 1, 1)
    assert "Resume with a changed setting (allowed): trainer.epochs: 3 -> 5" in caplog.text


@pytest.mark.integration
def test_run_py_resume_with_another_optimizer_is_one_line(tmp_path, saved_run):
    result = run_patched(tmp_path, [f"resume={saved_run}", "optimizer=sgd"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: resume={saved_run} continues {saved_run} with its own config")
    assert "optimizer.name: 'adam' -> 'sgd'" in error and error.endswith("Drop these overrides, or start a new run")


@pytest.mark.integration
def test_resume_of_a_folder_that_is_no_run_is_one_line_and_makes_no_folder(tmp_path):
    result = run_patched(tmp_path, [f"resume={tmp_path / 'nothere'}"])
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


@pytest.mark.unit
def test_resume_latest_locked_by_its_command_resolves_to_the_same_run(tmp_path, monkeypatch):
    """`resume=latest` locks the run it picks before Hydra starts; Hydra's resolver picks again, and must not pass
    over that run as one a live process trains (it is this process's own lock)."""
    from trainer.runs import locks
    from trainer.runs.folders import check_resume_argument, release_claimed_folders, resume_folder

    monkeypatch.chdir(tmp_path)
    _two_backed_up_runs(tmp_path)
    newest = Path("outputs") / "2026-11-30" / "10-00-00"
    check_resume_argument(["resume=latest"])
    try:
        assert locks.is_claimed(newest)
        assert resume_folder("latest") == str(newest)
    finally:
        release_claimed_folders()
    assert not locks.is_held(newest) and newest.is_dir()


@pytest.mark.unit
def test_only_the_chief_locks_the_folder_it_resumes(tmp_path, monkeypatch):
    """Every worker of a multi-worker run is restarted with `resume=RUN`; only the chief writes RUN, so only it
    locks it from the command line on (another worker locking it first would stop the chief as 'in use')."""
    from trainer.runs import locks
    from trainer.runs.folders import check_resume_argument, release_claimed_folders

    monkeypatch.chdir(tmp_path)
    _two_backed_up_runs(tmp_path)
    run_dir = Path("outputs") / "2026-11-30" / "10-00-00"
    try:
        monkeypatch.setenv("TF_CONFIG", tf_config([1, 2], 1))
        check_resume_argument(["strategy=multi_worker", f"resume={run_dir}"])
        assert not locks.is_claimed(run_dir) and not locks.is_held(run_dir)
        monkeypatch.setenv("TF_CONFIG", tf_config([1, 2], 0))
        check_resume_argument(["strategy=multi_worker", f"resume={run_dir}"])
        assert locks.is_claimed(run_dir)
        check_resume_argument(["-m", f"resume={run_dir}"])  # a sweep's job locks the folder it trains in itself
    finally:
        release_claimed_folders()


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["inspect", "evaluate"])
def test_resume_outside_training_is_one_line_before_it_locks_or_writes(tmp_path, monkeypatch, mode):
    """`resume=RUN mode=inspect` wrote inspect's files into the training run's folder (its config_tree.txt
    replaced, red team); `mode=evaluate` failed on a missing checkpoint= without naming resume=."""
    from trainer.errors import ConfigError
    from trainer.runs import locks
    from trainer.runs.folders import check_resume_argument, release_claimed_folders

    monkeypatch.chdir(tmp_path)
    _two_backed_up_runs(tmp_path)
    run_dir = Path("outputs") / "2026-11-30" / "10-00-00"
    try:
        with pytest.raises(
            ConfigError, match=rf"resume=\S+ continues training \(mode=train\), not mode={mode}"
        ) as refused:
            check_resume_argument([f"resume={run_dir}", f"mode={mode}"])
        assert not locks.is_claimed(run_dir) and not locks.is_held(run_dir)
    finally:
        release_claimed_folders()
    if mode == "evaluate":
        assert f"mode=evaluate checkpoint={run_dir}" in str(refused.value)


@pytest.mark.e2e
@pytest.mark.slow  # 18 s; the default suite keeps the changed-byte resume test, refused the same way
def test_a_resume_on_other_data_is_refused_and_a_moved_copy_passes(tmp_path):
    run_dir = tmp_path / "run"
    stopped = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2), signal_in_first_step(signal.SIGTERM))
    assert stopped.returncode == 0 and (run_dir / "data.json").is_file()
    shifted = write_cifar(tmp_path / "shifted")  # the same names, sizes and counts, every label + 1
    for path in shifted.glob("*.bin"):
        records = np.frombuffer(path.read_bytes(), np.uint8).reshape(-1, 3073).copy()
        records[:, 0] = (records[:, 0] + 1) % 10
        path.write_bytes(records.tobytes())
    refused = run_patched(tmp_path, [f"resume={run_dir}", f"dataset.data_dir={shifted}"])
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: the data differs from what {run_dir} trained on (test: test_batch.bin has other "
        f"content); point dataset.data_dir at that data, or continue on this data with allow_data_change=true"
    )
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "cifar", moved)
    shutil.rmtree(tmp_path / "cifar")
    resume_run(tmp_path, run_dir, f"dataset.data_dir={moved}")  # the same data in another folder
    assert_finished_once(run_dir, 2)


@pytest.mark.integration
def test_a_resume_finds_a_changed_byte_that_the_sampled_checksum_never_reads(tmp_path, monkeypatch):
    """The sampled checksum reads 3 x 64 KiB a file; the first epoch's whole-file checksum finds the rest."""
    data = write_cifar(tmp_path / "cifar", records_per_file=200)  # 614,600 bytes a file
    run_dir = tmp_path / "run"
    arguments = [*tiny_overrides(data), "trainer.epochs=2", f"hydra.run.dir={run_dir}"]
    with monkeypatch.context() as patched:  # preempted in this process in epoch 2 (2 steps an epoch)
        stop_after_steps(patched, 3)
        stopped = run_cli(arguments, cwd=tmp_path)
    assert stopped.returncode == 0 and backup_epoch(run_dir) == 1, stopped.stderr[-3000:]
    recorded = json.loads((run_dir / "data.json").read_text())["sha256"]
    assert [name for name, _, _ in recorded] == [*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"]
    batch = data / "data_batch_1.bin"
    original = batch.read_bytes()
    records = np.frombuffer(original, np.uint8).reshape(-1, 3073).copy()
    records[40:80, 1:] = 255 - records[40:80, 1:]  # pixels of records 40-79: bytes 122,920 to 245,839
    batch.write_bytes(records.tobytes())
    refused = run_patched(tmp_path, [f"resume={run_dir}"])
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: data_batch_1.bin has other content than the run trained on (its whole-file "
        f"checksum differs); point dataset.data_dir at that data, or continue on this data with allow_data_change=true"
    )
    assert history_epochs(run_dir) == [1] and backup_epoch(run_dir) == 1, "the resumed epoch was not committed"
    batch.write_bytes(original)
    (run_dir / "data.json").rename(tmp_path / "data.json")
    missing = run_patched(tmp_path, [f"resume={run_dir}"])
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1] == (
        f"error: resume={run_dir}: {run_dir / 'data.json'} is missing or unreadable, so the data cannot be checked "
        f"against what the run trained on; continue on this data knowingly with allow_data_change=true"
    )
    (tmp_path / "data.json").rename(run_dir / "data.json")
    resume_run(tmp_path, run_dir)
    assert_finished_once(run_dir, 2)


@pytest.mark.unit
@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_an_unreadable_data_json_is_refused_as_a_missing_one(tmp_path, content):
    from trainer.runs.resume import DATA_FILE, bind_data

    (tmp_path / DATA_FILE).write_text(content)
    with pytest.raises(ConfigError, match=f"{re.escape(str(tmp_path / DATA_FILE))} is missing or unreadable"):
        bind_data(tmp_path, {"train": {"records": 1, "files": []}}, resume=str(tmp_path), done=1)
    bind_data(tmp_path, {"train": {"records": 1, "files": []}}, resume=str(tmp_path), done=1, allow_change=True)


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
