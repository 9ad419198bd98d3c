"""The line a stopped run ends with and the line its resume starts with say the same thing, and what happens: where
in the epoch training goes on (`trainer.tasks.phases`, `trainer.training.resumed.going_on`)."""

from __future__ import annotations

import pytest

from conftest import assert_finished_once, run_cli, tiny_overrides, write_cifar

CASES = [
    # (the step of a 2-step epoch 1 the time budget runs out at, the stop's words, the resume's, steps trained again)
    pytest.param(
        2,
        "in epoch 1, after step 2 of 2; the backup is in {backup}: resumed, epoch 1 goes on after its last step "
        "(2 of 2), with only its end left.",
        "Epoch 1 goes on after its last step (2 of 2), with only its end left, where its backup was made: no step "
        "is trained again; its validation and checkpoints are made now",
        id="after-the-epochs-last-step",
    ),
    pytest.param(
        1,
        "in epoch 1, after step 1 of 2; the backup is in {backup}: resumed, epoch 1 goes on at step 2 of 2.",
        "Epoch 1 goes on at step 2 of 2, where its backup was made: the 1 step(s) before it are not trained again",
        id="within-the-epoch",
        marks=pytest.mark.slow,  # the same lines as the default case's, another number
    ),
]


@pytest.mark.integration
@pytest.mark.parametrize(("stop_at", "stopped_line", "resumed_line"), CASES)
def test_a_time_budget_stop_and_its_resume_say_where_training_goes_on(
    tmp_path, monkeypatch, stop_at, stopped_line, resumed_line
):
    """Out of time after the last step of epoch 1, the run said 'epoch 1 will be redone from the backup' and its
    resume 'Epoch 1 goes on at step 3 of 2': neither was so. The resume trains none of epoch 1's steps again (it
    makes that epoch's validation and checkpoints) and then epoch 2's steps; both lines now say so."""
    from trainer.training import callbacks

    run_dir = tmp_path / "run"
    arguments = [*tiny_overrides(write_cifar(tmp_path / "cifar")), f"hydra.run.dir={run_dir}"]
    arguments += ["trainer.epochs=2", "trainer.steps_per_epoch=2", "trainer.time_budget=1h"]
    with monkeypatch.context() as patched:  # the budget runs out at step `stop_at` (the clock is not the point)
        patched.setattr(callbacks.TimeBudget, "out_of_time_in_epoch", lambda budget: budget.steps_seen >= stop_at)
        stopped = run_cli(arguments, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    expected = stopped_line.format(backup=run_dir / "backup")
    assert f"Stopped by the time budget (trainer.time_budget=1h) {expected}" in stopped.stdout + stopped.stderr

    trained, heard = [], callbacks.EpochLog.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):  # the steps the resume trains (passed-over ones are not heard)
        trained.append(batch)
        heard(self, batch, logs)

    monkeypatch.setattr(callbacks.EpochLog, "on_train_batch_end", on_train_batch_end)
    resumed = run_cli([f"resume={run_dir}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed_line in resumed.stdout + resumed.stderr
    assert trained == [*range(stop_at, 2), 0, 1], (
        "the resume trains the steps the lines say: the rest of epoch 1, epoch 2"
    )
    assert_finished_once(run_dir, 2)


@pytest.mark.unit
def test_a_stop_after_the_last_epoch_promises_only_the_test_evaluation():
    """SIGTERM in the last epoch's validation logged 'resumed, epoch 2 starts at its first step' of a 1-epoch run,
    whose resume trains nothing and only evaluates (red team)."""
    from trainer.training.resumed import going_on

    assert going_on(1, 0, 2, epochs=1) == "every epoch is done, only the test evaluation is left"
    assert going_on(1, 0, 2, epochs=2) == "epoch 2 starts at its first step"
    assert going_on(0, 2, 2, epochs=1) == "epoch 1 goes on after its last step (2 of 2), with only its end left"
