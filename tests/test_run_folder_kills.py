"""Every epoch exactly once whatever stops a run: kills in a save, a commit, epoch 1 or the test evaluation, resumed."""

from __future__ import annotations

import json
import signal

import keras
import pytest

from conftest import (
    assert_finished_once,
    backup_epoch,
    history_epochs,
    kill_in_write,
    resume_run,
    run_patched,
    signal_in_first_step,
    stop_after_steps,
    temporaries,
    train_arguments,
)
from trainer.runs.backup import METADATA

# --- epoch accounting -------------------------------------------------------------------------------

KILL_POINTS = [
    # (patch, epochs in history.csv right after the kill): the epoch is committed after its row and checkpoints
    pytest.param(kill_in_write("trainer.training.callbacks", "last.keras", 2), [1], id="inside-checkpoint-save"),
    pytest.param(
        kill_in_write("trainer.runs.backup", METADATA, 2),  # epoch 2's commit: written, not renamed
        [1, 2],
        id="inside-backup-commit",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("patch", "history_after_kill"), KILL_POINTS)
def test_sigkill_at_the_end_of_an_epoch_redoes_that_epoch_and_skips_none(tmp_path, patch, history_after_kill):
    """The resumed run also ends with the weights of a run never killed: the backup restores exactly (weights,
    optimizer state, the seed states of the model's random flips and colour changes) and the input goes on where
    it was: the redone epoch 2 sees epoch 2's order, crops, flips and masks, not epoch 1's again."""
    run_dir = tmp_path / "run"
    base = [*train_arguments(tmp_path, tmp_path / "unused", epochs=3)[:-1], "trainer.deterministic=true"]
    killed = run_patched(tmp_path, [*base, f"hydra.run.dir={run_dir}"], patch)
    assert killed.returncode == -signal.SIGKILL
    assert history_epochs(run_dir) == history_after_kill
    assert backup_epoch(run_dir) == 1, "epoch 2 is not committed: its files were not all on disk"
    assert temporaries(run_dir), "the kill left the half-renamed file behind"
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()

    resumed = resume_run(tmp_path, run_dir)
    assert f"Resuming {run_dir} after epoch 1" in resumed.stdout + resumed.stderr
    assert_finished_once(run_dir, 3)
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == overrides, "the original .hydra/ stays"
    assert not list(tmp_path.glob("outputs")), "no new folder for the resumed run"
    log = (run_dir / "run.log").read_text()
    assert "Epoch 1/3" in log and "Resuming" in log, "the resumed run appends to RUN/run.log"
    events = [json.loads(line) for line in (run_dir / "invocations.jsonl").read_text().splitlines()]
    assert [event["event"] for event in events] == ["start", "start", "end"]  # the kill left no end line
    assert f"resume={run_dir}" in events[1]["command"] and events[2]["outcome"] == "finished"
    never = tmp_path / "never"
    assert run_patched(tmp_path, [*base, f"hydra.run.dir={never}"]).returncode == 0
    assert (run_dir / "history.csv").read_text() == (never / "history.csv").read_text()
    sha = [json.loads((folder / "metrics.json").read_text())["weights_sha256"] for folder in (run_dir, never)]
    assert sha[0] == sha[1]


PRECISIONS = [  # issue 52: each mixed policy resumes exactly too (tests/test_precision_features.py: its features)
    # float32: the default suite's SIGKILL test above (a kill inside epoch 2's last.keras) compares with a run
    # never killed the same way
    pytest.param("float32", marks=pytest.mark.slow),
    pytest.param("mixed_bfloat16", marks=pytest.mark.slow),
    pytest.param("mixed_float16", marks=pytest.mark.slow),  # the loss scale and its step counter restored too
]


@pytest.mark.e2e
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_run_killed_and_resumed_ends_with_the_weights_of_a_run_never_killed(tmp_path, precision):
    """The backup restores exactly (weights, optimizer state, the loss scale of mixed_float16, the seed states of
    dropout and the model's random flips and colour changes) and the input goes on where it was: a resumed epoch 3
    sees epoch 3's order, crops, flips and masks, not epoch 1's again."""
    base = [*train_arguments(tmp_path, tmp_path / "unused", epochs=3)[:-1], "trainer.deterministic=true"]
    base.append(f"trainer.precision={precision}")
    kill = kill_in_write("trainer.training.callbacks", "last.keras", 3)
    killed = run_patched(tmp_path, [*base, f"hydra.run.dir={tmp_path / 'killed'}"], kill)
    assert killed.returncode == -signal.SIGKILL and backup_epoch(tmp_path / "killed") == 2
    resume_run(tmp_path, tmp_path / "killed")
    assert run_patched(tmp_path, [*base, f"hydra.run.dir={tmp_path / 'never'}"]).returncode == 0
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
    kill = kill_in_write("trainer.training.callbacks", "last.keras", 3)
    digests = []
    for name, patch in (("linked", ""), ("saved", SAVE_THE_WEIGHTS_AT_EPOCH_ENDS)):
        arguments = [*train_arguments(tmp_path, tmp_path / name, epochs=3), "trainer.deterministic=true"]
        killed = run_patched(tmp_path, arguments, kill + patch)
        assert killed.returncode == -signal.SIGKILL and backup_epoch(tmp_path / name) == 2
        backup_files = [path.name for path in (tmp_path / name / "backup").iterdir()]
        assert any(name.endswith(".keras") for name in backup_files) == (name == "linked"), backup_files
        resume_run(tmp_path, tmp_path / name)
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
    stopped = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2), signal_in_first_step(signum))
    assert history_epochs(run_dir) == []
    if signum == signal.SIGTERM:
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        assert f"To continue, run: python run.py resume={run_dir}" in stopped.stdout + stopped.stderr
        assert backup_epoch(run_dir) == 0
    elif signum == signal.SIGINT:  # Ctrl-C: the same, then exit 130 as a shell does, and no traceback
        assert stopped.returncode == 130, stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stderr and backup_epoch(run_dir) == 0
        assert stopped.stderr.strip().splitlines()[-1] == (
            f"interrupted (Ctrl-C); the backup is saved. To continue, run: python run.py resume={run_dir}"
        )
    else:
        assert stopped.returncode == -signal.SIGKILL
    resumed = resume_run(tmp_path, run_dir)
    assert "the run finished" not in resumed.stdout + resumed.stderr
    assert_finished_once(run_dir, 2)
    events = [json.loads(line) for line in (run_dir / "invocations.jsonl").read_text().splitlines()]
    first = ["start"] if signum == signal.SIGKILL else ["start", "end"]
    assert [event["event"] for event in events] == [*first, "start", "end"]
    outcome = {signal.SIGTERM: ["preempted"], signal.SIGINT: ["interrupted"], signal.SIGKILL: []}[signum]
    assert [event["outcome"] for event in events if event["event"] == "end"] == [*outcome, "finished"]


KILL_IN_EVALUATION = """
import trainer.tasks.train as target
def evaluate_checkpoint(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
target.evaluate_checkpoint = evaluate_checkpoint
"""


@pytest.mark.e2e
def test_a_kill_in_the_test_evaluation_is_resumed_into_the_evaluation(tmp_path):
    run_dir = tmp_path / "run"
    killed = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2), KILL_IN_EVALUATION)
    assert killed.returncode == -signal.SIGKILL
    assert history_epochs(run_dir) == [1, 2] and not (run_dir / "metrics.json").exists()
    assert backup_epoch(run_dir) == 2, "the backup stays until metrics.json is written"
    resumed = resume_run(tmp_path, run_dir)
    output = resumed.stdout + resumed.stderr
    assert "All 2 epochs are done: running the test evaluation" in output and "Epoch 1/2" not in output
    assert_finished_once(run_dir, 2)
    from trainer.runs.checkpoints import weights_fingerprint

    final = keras.saving.load_model(run_dir / "checkpoints" / "last.keras")
    assert json.loads((run_dir / "metrics.json").read_text())["weights_sha256"] == weights_fingerprint(final)


@pytest.mark.e2e
@pytest.mark.slow  # the kill in the test evaluation of a run that completed covers the path (16 s)
def test_an_early_stopped_run_killed_in_its_test_evaluation_resumes_into_the_evaluation_only(tmp_path):
    run_dir = tmp_path / "run"
    stop = ["callbacks=early_stopping", "callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=1.0"]
    killed = run_patched(tmp_path, [*train_arguments(tmp_path, run_dir, epochs=5), *stop], KILL_IN_EVALUATION)
    assert killed.returncode == -signal.SIGKILL
    assert history_epochs(run_dir) == [1, 2] and not (run_dir / "metrics.json").exists()  # stopped at epoch 2 of 5
    resumed = resume_run(tmp_path, run_dir)
    output = resumed.stdout + resumed.stderr
    assert "Training ended after epoch 2 (stopped early): running the test evaluation" in output
    assert "Epoch 3/5" not in output
    assert_finished_once(run_dir, 2)
    assert json.loads((run_dir / "metrics.json").read_text())["stopped_early"] is True


KILL_AFTER_SECOND_BEST = """
import trainer.training.callbacks as target
original, writes = target.write_atomic, []
init = target.Checkpoints.__init__
def patched_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.tolerance = float("inf")  # every epoch is a new best in this process
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
    killed = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2), KILL_AFTER_SECOND_BEST)
    assert killed.returncode == -signal.SIGKILL and history_epochs(run_dir) == [1] and backup_epoch(run_dir) == 1
    resume_run(tmp_path, run_dir)
    assert_finished_once(run_dir, 2)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    best, last = run_dir / "checkpoints" / "best.keras", run_dir / "checkpoints" / "last.keras"
    assert metrics["best_epoch"] == 1 and read_info(best).epoch == 1 and read_info(last).epoch == 2
    assert weights_fingerprint(keras.saving.load_model(best)) != weights_fingerprint(keras.saving.load_model(last))
    assert not list((run_dir / "checkpoints").glob("best.pending*"))


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("steps_before", "strategy"),
    [
        pytest.param(6, [], id="two-steps-into-epoch-2"),
        # 12 s: slow; a kill at the epoch's end is the default SIGKILL test's
        pytest.param(8, [], id="at-epoch-2s-last-step", marks=pytest.mark.slow),
        pytest.param(6, ["strategy=mirrored", "strategy.cpu_devices=2"], id="mirrored", marks=pytest.mark.slow),
    ],
)
def test_a_run_stopped_within_an_epoch_and_resumed_ends_with_the_weights_of_a_run_never_stopped(
    tmp_path, monkeypatch, steps_before, strategy
):
    """SIGTERM `steps_before` steps into a run of 4 steps an epoch: the backup is made there, and the resumed
    run goes on from that step: the learning-rate schedule (cosine, set every step), history.csv (its epoch 2
    row's means too) and the final weights are those of the same run never stopped. The resume redid epoch 2
    from its first batch with the weights of its third step, the schedule running those steps ahead."""
    from conftest import run_cli

    cosine = ["optimizer.schedule.name=cosine", "trainer.steps_per_epoch=4", "trainer.deterministic=true"]
    base = [*train_arguments(tmp_path, tmp_path / "unused", epochs=3)[:-1], *cosine, *strategy]
    with monkeypatch.context() as patched:
        stop_after_steps(patched, steps_before)
        stopped = run_cli([*base, f"hydra.run.dir={tmp_path / 'stopped'}"], cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    # A preemption's signal (test_fault_tolerance.py's slow tier sends it from outside a real process): exit 0,
    # the command to continue, and the invocation's end line says why it stopped.
    assert f"To continue, run: python run.py resume={tmp_path / 'stopped'}" in stopped.stdout + stopped.stderr
    end = json.loads((tmp_path / "stopped" / "invocations.jsonl").read_text().splitlines()[-1])
    assert end["outcome"] == "preempted" and end["stopped"] == "SIGTERM"
    assert history_epochs(tmp_path / "stopped") == [1] and backup_epoch(tmp_path / "stopped") == 1
    assert json.loads((tmp_path / "stopped" / "backup" / METADATA).read_text())["batch"] == steps_before - 4
    resumed = run_cli([f"resume={tmp_path / 'stopped'}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_finished_once(tmp_path / "stopped", 3)
    assert run_cli([*base, f"hydra.run.dir={tmp_path / 'never'}"], cwd=tmp_path).returncode == 0
    rows = [(tmp_path / name / "history.csv").read_text() for name in ("stopped", "never")]
    assert rows[0] == rows[1]
    metrics = [json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("stopped", "never")]
    sha = [metric["weights_sha256"] for metric in metrics]
    assert sha[0] == sha[1]
    passed = steps_before - 4  # of epoch 2's 4 steps; after all 4, only the epoch's end is left
    where = f"goes on at step {passed + 1} of 4" if passed < 4 else "goes on after its last step (4 of 4)"
    assert f"Epoch 2 {where}, " in resumed.stdout + resumed.stderr
