"""The vggtrain_optuna sweeper (`hparams_search=vgg19_optuna`): its search space, its study (resume, sharing, dead
sweeps), pruning across jobs, multi-objective, what it writes, and its one-line refusals.

The searches run `python run.py -m ...` in this process (`conftest.run_cli`); a kill needs a real process."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    ROOT,
    SUBPROCESS_ENV,
    cifar_overrides,
    csv_rows,
    run_cli,
    run_patched,
    signal_in_first_step,
    tiny_overrides,
    write_cifar,
)

optuna = pytest.importorskip("optuna", reason='needs the sweep extra: pip install -e ".[sweep]"')

SEARCH = ["hparams_search=vgg19_optuna", "hydra.sweeper.sampler.n_startup_trials=2"]


def _search(tmp_path: Path, *overrides: str):
    """A search over the three-layer test model on tiny CIFAR-format files; its sweep folder is tmp/sweep."""
    data = tmp_path / "cifar"
    if not data.exists():
        write_cifar(data)
    arguments = ["-m", *tiny_overrides(data), *SEARCH, f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    return run_cli(arguments, cwd=tmp_path)


def _study(tmp_path: Path, name: str = "vgg19"):
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "sweep" / "study.journal")))
    return optuna.load_study(study_name=name, storage=storage)


# --- the search space ---------------------------------------------------------------------------------------


@pytest.mark.unit
def test_params_become_optuna_distributions_and_fixed_values():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from trainer.search.space import parse_space

    params = {
        "optimizer.lr": "tag(log, interval(0.001, 0.2))",
        "model.dropout": "interval(0.0, 0.6)",
        "trainer.epochs": "range(2, 10, 2)",
        "optimizer": "choice(adam, sgd)",
        "trainer.verbose": "0",
    }
    space = parse_space(params, ["model.dropout=interval(0.1, 0.2)"])  # the command line wins
    assert space.distributions == {
        "optimizer.lr": FloatDistribution(0.001, 0.2, log=True),
        "model.dropout": FloatDistribution(0.1, 0.2),
        "trainer.epochs": IntDistribution(2, 8, step=2),
        "optimizer": CategoricalDistribution(["adam", "sgd"]),
    }
    assert space.fixed == {"trainer.verbose": "0"}
    assert space.overrides({"optimizer": "sgd", "trainer.epochs": 4}) == [
        "optimizer='sgd'",
        "trainer.epochs=4",
        "trainer.verbose=0",
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "value, message",
    [
        ("uniform(0, 1)", "hydra.sweeper.params.model.dropout: 'uniform(0, 1)' is not interval(LOW, HIGH)"),
        ("tag(lg, interval(0.1, 0.2))", "hydra.sweeper.params.model.dropout: unknown tag ['lg']"),
        ("interval(0.5, 0.1)", "hydra.sweeper.params.model.dropout: interval(0.5, 0.1) needs LOW < HIGH"),
        ("tag(log, interval(0, 1))", "hydra.sweeper.params.model.dropout: interval(0.0, 1.0) needs 0 < LOW < HIGH"),
        ("range(5, 5)", "hydra.sweeper.params.model.dropout: range(5, 5, 1) is empty"),
    ],
)
def test_a_bad_distribution_is_one_line_naming_the_key(value, message):
    from trainer.errors import ConfigError
    from trainer.search.space import parse_space

    with pytest.raises(ConfigError) as caught:
        parse_space({"model.dropout": value}, [])
    assert str(caught.value).startswith(message)


# --- the study: dead sweeps, sharing ------------------------------------------------------------------------


def _journal_study(tmp_path: Path, name: str = "s"):
    from trainer.search.study import open_storage, open_study

    return open_study(name, open_storage(str(tmp_path / "s.journal")), ["maximize"], None, None)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.unit
def test_a_trial_of_a_dead_sweep_is_failed_and_run_again_up_to_retries(tmp_path):
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    from trainer.search import study as studies

    study = _journal_study(tmp_path)
    space = {"x": FloatDistribution(0, 1)}
    dead = study.ask(space)
    dead.set_user_attr(studies.OWNER, f"{studies.Owner().host}:{_dead_pid()}:abc")
    alive = study.ask(space)
    me = studies.Owner()
    me.claim(alive)
    log = logging.getLogger("test")
    studies.fail_dead_trials(study, me, grace_seconds=3600, retries=1, log=log)
    trials = study.get_trials(deepcopy=False)
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    assert study.user_attrs[studies.killed_key(0)] and trials[2].user_attrs[studies.RETRY_OF] == 0
    assert [trial.number for trial in studies.counted(trials)] == [1, 2], "the retry takes the dead trial's place"

    retry = study.ask(space)  # the enqueued retry: the same parameters
    assert retry.number == 2 and retry.params == dead.params
    retry.set_user_attr(studies.OWNER, f"{me.host}:{_dead_pid()}:def")
    studies.fail_dead_trials(study, me, grace_seconds=3600, retries=1, log=log)
    assert len(study.trials) == 3, "retries=1: a trial killed twice is not run a third time"
    assert study.trials[2].state == TrialState.FAIL


@pytest.mark.unit
def test_a_silent_trial_of_another_machine_is_dead_after_the_grace_period(tmp_path):
    from optuna.distributions import FloatDistribution

    from trainer.search import study as studies

    study = _journal_study(tmp_path)
    trial = study.ask({"x": FloatDistribution(0, 1)})
    trial.set_user_attr(studies.OWNER, "another-host:1:abc")
    trial.set_user_attr(studies.HEARTBEAT, time.time() - 60)
    frozen = study.get_trials(deepcopy=False)[0]
    me = studies.Owner()
    assert not me.is_dead(frozen, grace_seconds=120) and me.is_dead(frozen, grace_seconds=30)


@pytest.mark.unit
def test_trials_asked_past_n_trials_by_sweeps_sharing_the_study_are_surplus(tmp_path):
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    from trainer.search import study as studies

    first, second = _journal_study(tmp_path), _journal_study(tmp_path)  # two sweeps, one study
    space = {"x": FloatDistribution(0, 1)}
    mine = [first.ask(space) for _ in range(2)]
    theirs = [second.ask(space) for _ in range(2)]  # both saw 0 of 3 trials, and asked 2
    kept = studies.within_budget(first, mine, 3) + studies.within_budget(second, theirs, 3)
    assert [trial.number for trial in kept] == [0, 1, 2]
    trials = first.get_trials(deepcopy=False)
    assert trials[3].state == TrialState.FAIL and trials[3].user_attrs[studies.SURPLUS]
    assert len(studies.counted(trials)) == 3


# --- searches ---------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_search_writes_its_study_and_the_same_command_continues_it(tmp_path):
    result = _search(tmp_path, "hydra.sweeper.n_trials=2")
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    study = csv_rows(sweep / "study.csv")
    assert [row["state"] for row in study] == ["complete", "complete"]
    assert {"optimizer.lr", "model.dropout", "model.weight_decay", "val_accuracy"} <= set(study[0])
    for number, row in enumerate(study):  # the value told is the job's return value, its best val_accuracy
        metrics = json.loads((sweep / str(number) / "metrics.json").read_text())
        assert float(row["val_accuracy"]) == pytest.approx(metrics["objective"])
        assert float(row["optimizer.lr"]) == pytest.approx(_study(tmp_path).trials[number].params["optimizer.lr"])
    for plot in ("optimization_history.png", "parallel_coordinate.png", "param_importances.png"):
        assert (sweep / plot).stat().st_size > 1000, plot
    assert len(csv_rows(sweep / "best.csv")) == 1
    assert [row["status"] for row in csv_rows(sweep / "summary.csv")] == ["complete", "complete"]

    again = _search(tmp_path, "hydra.sweeper.n_trials=3")  # the same study, one more trial
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Study vgg19 in" in again.stdout and "2 of 3 trials already there" in again.stdout
    study = _study(tmp_path)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3, "no trial ran twice"
    assert sorted(path.name for path in sweep.iterdir() if path.name.isdigit()) == ["0", "1", "2"]
    assert len(csv_rows(sweep / "summary.csv")) == 3

    done = _search(tmp_path, "hydra.sweeper.n_trials=3")
    assert done.returncode == 0 and len(_study(tmp_path).trials) == 3, "the study has its 3 trials: none runs"


@pytest.mark.e2e
def test_the_pruner_stops_a_trial_after_an_epoch_and_its_folder_is_complete(tmp_path):
    pruner = "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:2.0}"  # accuracy < 2: prune
    told = "objective.prune_metric=accuracy"  # the training accuracy, where val_accuracy is the objective
    result = _search(tmp_path, "hydra.sweeper.n_trials=1", "trainer.epochs=3", pruner, told)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "sweep" / "0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["pruned"] is True and metrics["epochs_completed"] == 1 and "test_accuracy" in metrics
    assert len(csv_rows(run / "history.csv")) == 1
    assert _study(tmp_path).trials[0].state.name == "PRUNED"
    pruned_row = csv_rows(tmp_path / "sweep" / "study.csv")[0]
    assert pruned_row["state"] == "pruned"
    # The run's own val_accuracy, not the training accuracy Optuna kept as the pruned trial's value
    assert float(pruned_row["val_accuracy"]) == pytest.approx(metrics["objective"])
    assert csv_rows(tmp_path / "sweep" / "summary.csv")[0]["status"] == "pruned"
    assert "Pruned after epoch 1: the study's pruner stops this trial (accuracy " in (run / "run.log").read_text()
    told = _study(tmp_path).trials[0].intermediate_values
    assert told == {0: pytest.approx(float(csv_rows(run / "history.csv")[0]["accuracy"]), abs=1e-6)}
    import tensorflow as tf

    scalars = {}  # TensorBoard HParams: the trial's session shows it pruned
    for events in (run / "tensorboard").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.tag.startswith("hparams/"):
                    scalars[value.tag] = float(tf.make_ndarray(value.tensor))
    assert scalars["hparams/pruned"] == 1.0


@pytest.mark.e2e
@pytest.mark.slow
def test_a_multi_objective_search_writes_its_pareto_front(tmp_path):
    objectives = ["hydra.sweeper.direction=[maximize,minimize]", "hydra.sweeper.metrics=[val_accuracy,train_seconds]"]
    result = _search(tmp_path, "hydra.sweeper.n_trials=2", *objectives)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    study = csv_rows(sweep / "study.csv")
    for number, row in enumerate(study):
        metrics = json.loads((sweep / str(number) / "metrics.json").read_text())
        assert float(row["train_seconds"]) == pytest.approx(metrics["train_seconds"])
        assert float(row["val_accuracy"]) == pytest.approx(metrics["val_accuracy"])
    front = csv_rows(sweep / "best.csv")
    assert 1 <= len(front) <= 2 and "Pareto front" in result.stdout
    assert (sweep / "pareto_front.png").is_file()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_search_over_accuracy_and_latency_on_digits_measures_each_trials_served_model(tmp_path):
    arguments = [
        "-m", "hparams_search=vgg19_optuna", "hydra.sweeper.directions=[maximize,minimize]",
        "objective.metrics=[val_accuracy,latency_ms]", "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.n_startup_trials=3", "model.width_multiplier=choice(0.0625,0.125)",
        "model.fc_units=32", "trainer.epochs=1", "trainer.steps_per_epoch=3", "evaluate.report=false",
        "logger=csv", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]  # fmt: skip
    result = run_cli(arguments, cwd=tmp_path)  # the bundled digits (dataset=digits, the default)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    study = _study(tmp_path)
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:  # the study is told what each trial measured on its exported SavedModel's serve
        metrics = json.loads((sweep / str(trial.number) / "metrics.json").read_text())
        assert metrics["latency"].startswith("SavedModel serve, batch 1")
        assert trial.values == pytest.approx([metrics["val_accuracy"], metrics["latency_ms"]])
        assert metrics["latency_ms"] > 0
    summary = csv_rows(sweep / "summary.csv")
    assert [float(row["latency_ms"]) for row in summary] == pytest.approx(
        [json.loads((Path(row["run_dir"]) / "metrics.json").read_text())["latency_ms"] for row in summary]
    )
    front = csv_rows(sweep / "best.csv")
    assert {int(row["trial"]) for row in front} == {trial.number for trial in study.best_trials}
    assert all(row["run_dir"] == str(sweep / row["trial"]) for row in front), "each trial of the front names its folder"
    assert "Pareto front" in result.stdout and f"-> {sweep / front[0]['trial']}" in result.stdout
    assert (sweep / "pareto_front.png").stat().st_size > 10_000


BAD_SPACE = """# @package _global_
defaults:
  - vgg19_optuna
hydra:
  sweeper:
    params:
      model.dropout: uniform(0, 1)
"""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["hparams_search=bad_space"], "hydra.sweeper.params.model.dropout: 'uniform(0, 1)' is not interval("),
        (["hydra.sweeper.params.model.dropout=uniform(0,1)"], "hydra.sweeper.params.model.dropout=uniform(0,1): Hydra"),
        (["hydra.sweeper.n_jobs=2"], "hydra.sweeper.n_jobs=2: the launcher runs at most 1 jobs at once"),
        (["hydra.sweeper.storage=sqlite:////no/such/folder/s.db"], "hydra.sweeper.storage: cannot open"),
        (["hydra.sweeper.direction=[maximize,minimize]"], "objective.metrics must name one metrics.json key"),
        (
            ["hydra.sweeper.directions=[maximize,minimize]", "objective.metrics=[val_accuracy,latency_ms,val_loss]"],
            "objective.metrics=['val_accuracy', 'latency_ms', 'val_loss'] names 3 metrics and "
            "hydra.sweeper.directions=['maximize', 'minimize'] 2 directions: give one direction per metric",
        ),
        (
            [
                "hydra.sweeper.directions=[maximize,minimize]",
                "objective.metrics=[val_accuracy,latency_ms]",
                "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner}",
            ],
            "hydra.sweeper.pruner: Optuna prunes single-objective studies only; set it to null",
        ),  # fmt: skip
        (["hydra.sweeper.pruner={_target_:optuna.pruners.MedianPrunr}"], "hydra.sweeper.pruner._target_=optuna.prun"),
    ],
)
def test_a_bad_search_setting_is_one_line_before_any_trial(tmp_path, overrides, message):
    presets = tmp_path / "conf" / "hparams_search"
    presets.mkdir(parents=True)
    (presets / "bad_space.yaml").write_text(BAD_SPACE)
    result = _search(tmp_path, *overrides, f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), result.stderr[-2000:]
    assert not any(path.name.isdigit() for path in (tmp_path / "sweep").glob("*")), "no trial ran"


@pytest.mark.e2e
@pytest.mark.slow
def test_a_study_of_another_direction_or_space_is_refused_naming_the_difference(tmp_path):
    assert _search(tmp_path, "hydra.sweeper.n_trials=1").returncode == 0
    other_direction = _search(tmp_path, "objective.mode=min", "objective.metric=val_loss")
    assert other_direction.stderr.strip().splitlines()[-1] == (
        "error: hydra.sweeper.study_name: study 'vgg19' is stored with direction ['maximize'], and this search has "
        "['minimize']; give this search another study_name (or storage)"
    )
    other_space = _search(tmp_path, "model.dropout=interval(0.1,0.2)")  # a command-line sweep joins the space
    line = other_space.stderr.strip().splitlines()[-1]
    assert line.startswith("error: hydra.sweeper.study_name: study 'vgg19' searched model.dropout over"), line
    assert len(_study(tmp_path).trials) == 1


# --- kills and shared studies: real processes -----------------------------------------------------------------


def _search_command(tmp_path: Path, *overrides: str) -> list[str]:
    data = tmp_path / "cifar"
    if not data.exists():
        write_cifar(data)
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    return [sys.executable, str(ROOT / "run.py"), "-m", *tiny_overrides(data), *SEARCH, sweep, *overrides]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sweep_killed_in_a_trial_goes_on_with_the_same_command(tmp_path):
    overrides = ["hydra.sweeper.n_trials=3", "trainer.epochs=4"]
    process = subprocess.Popen(
        _search_command(tmp_path, *overrides), cwd=tmp_path, env=SUBPROCESS_ENV, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    history = tmp_path / "sweep" / "1" / "history.csv"
    deadline = time.monotonic() + 300
    while not (history.is_file() and len(csv_rows(history)) >= 1):
        assert process.poll() is None and time.monotonic() < deadline, "the sweep ended before trial 1 trained"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert [trial.state.name for trial in _study(tmp_path).trials] == ["COMPLETE", "RUNNING"]

    again = _search(tmp_path, *overrides)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Trial 1 was running when its sweep died: failed, and run again" in again.stdout
    trials = _study(tmp_path).trials
    assert [trial.state.name for trial in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert trials[2].params == trials[1].params and trials[2].user_attrs["vggtrain:retry_of"] == 1
    assert json.loads((tmp_path / "sweep" / "0" / "metrics.json").read_text())["epochs_completed"] == 4
    study = csv_rows(tmp_path / "sweep" / "study.csv")
    assert [row["state"] for row in study] == ["complete", "failed", "complete", "complete"]
    assert study[1]["killed"] == "True" and study[2]["retry_of"] == "1"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_ends_the_sweep_and_the_same_command_runs_the_stopped_trial_again(tmp_path, signum):
    """SIGTERM (or Ctrl-C) in trial 0's first step: its backup is saved, the sweep stops with exit 130 and says
    to rerun the sweep command, not `resume=` (which would train the trial outside its study). After SIGTERM the
    old sweep failed the trial, ran the next and exited 0; the same command then found its n_trials and never
    retried. After Ctrl-C it stopped, offering `python run.py resume=sweep/0`."""
    overrides = ["hydra.sweeper.n_trials=2"]
    data = tmp_path / "cifar"
    write_cifar(data)
    arguments = ["-m", *tiny_overrides(data), *SEARCH, f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    stopped = run_patched(tmp_path, arguments, signal_in_first_step(signum))
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert "rerun the sweep command" in last and "resume=" not in last, last
    assert "resume=" not in stopped.stdout, "no log line offers to resume the trial outside its study"
    assert not (tmp_path / "sweep" / "1").exists(), "no trial ran after the stop"
    trials = _study(tmp_path).trials
    assert [trial.state.name for trial in trials] == ["FAIL", "WAITING"]
    assert trials[0].user_attrs["vggtrain:interrupted"] is True and trials[1].user_attrs["vggtrain:retry_of"] == 0

    again = _search(tmp_path, *overrides)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 of 2 trials already there: it goes on; trial 0, stopped, runs again" in again.stdout
    trials = _study(tmp_path).trials
    assert [trial.state.name for trial in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].params == trials[0].params, "the stopped trial ran again"
    states = [row["state"] for row in csv_rows(tmp_path / "sweep" / "study.csv")]
    assert states == ["interrupted", "complete", "complete"]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_sweeps_sharing_a_study_run_exactly_n_trials_together(tmp_path):
    storage = f"hydra.sweeper.storage={tmp_path / 'shared.journal'}"
    command = _search_command(tmp_path, "hydra.sweeper.n_trials=4", storage, "trainer.threads=1")
    first, second = (
        subprocess.Popen(command, cwd=tmp_path, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
        for _ in range(2)
    )  # fmt: skip
    outputs = [process.communicate(timeout=600)[0] for process in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs[0][-2000:] + outputs[1][-2000:]
    from trainer.search.study import SURPLUS, open_storage

    study = optuna.load_study(study_name="vgg19", storage=open_storage(str(tmp_path / "shared.journal")))
    counted = [trial for trial in study.trials if not trial.user_attrs.get(SURPLUS)]
    assert [trial.state.name for trial in counted] == ["COMPLETE"] * 4


@pytest.mark.e2e
@pytest.mark.slow
def test_a_batch_of_trials_runs_in_parallel_through_the_joblib_launcher(tmp_path):
    result = _search(tmp_path, "launcher=joblib", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=2")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = _study(tmp_path).trials
    assert [trial.state.name for trial in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:  # each job ran in a worker process and wrote its outcome into the study from there
        metrics = json.loads((tmp_path / "sweep" / str(trial.number) / "metrics.json").read_text())
        assert trial.user_attrs["vggtrain:outcome"]["metrics"]["weights_sha256"] == metrics["weights_sha256"]
        assert trial.value == pytest.approx(metrics["objective"])
        threads = max(1, (os.cpu_count() or 1) // 2)
        assert (
            f"TensorFlow threads: {threads} intra-op"
            in (tmp_path / "sweep" / str(trial.number) / "run.log").read_text()
        )


@pytest.mark.e2e
@pytest.mark.slow
def test_two_parallel_jobs_prune_each_other_through_the_shared_study(tmp_path):
    """ASHA's rule across processes: two joblib jobs run at once, and the slow one is pruned at its first rung
    (after 2 epochs) on the other job's report there; alone at the rung it would have gone on."""
    from trainer.search.study import open_storage

    storage = open_storage(str(tmp_path / "sweep" / "study.journal"))
    study = optuna.create_study(study_name="vgg19", storage=storage, direction="minimize")
    fixed = {"model.dropout": 0.1, "model.weight_decay": 1e-5, "trainer.batch_size": 8}
    study.enqueue_trial({**fixed, "optimizer.lr": 0.003, "model.width_multiplier": 0.0625})  # fast, learns
    study.enqueue_trial({**fixed, "optimizer.lr": 1e-7, "model.width_multiplier": 1.0})  # slow, learns nothing
    data = tmp_path / "cifar"
    write_cifar(data)
    pruner = "{_target_:optuna.pruners.SuccessiveHalvingPruner,min_resource:1,reduction_factor:2}"
    arguments = [
        "-m", *cifar_overrides(data), *SEARCH, f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.verbose=0",
        "launcher=joblib", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4",  # the 2 enqueued run first
        "objective.metric=loss", "objective.mode=min", "trainer.epochs=3", "trainer.steps_per_epoch=8",
        "evaluate.report=false", "optimizer.lr=tag(log,interval(1e-7,0.01))",
        "model.width_multiplier=choice(0.0625,1.0)", f"hydra.sweeper.pruner={pruner}",
    ]  # fmt: skip
    result = run_cli(arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    fast, slow = _study(tmp_path).trials[:2]
    assert slow.datetime_start < fast.datetime_complete and fast.datetime_start < slow.datetime_complete, "at once"
    assert slow.state.name == "PRUNED" and sorted(slow.intermediate_values) == [0, 1], "pruned at its first rung"
    assert fast.state.name == "COMPLETE" and fast.intermediate_values[1] < slow.intermediate_values[1]
    alone = optuna.create_study(direction="minimize", pruner=optuna.pruners.SuccessiveHalvingPruner(1, 2))
    trial = alone.ask()
    for step, value in sorted(slow.intermediate_values.items()):
        trial.report(value, step)
    assert not trial.should_prune(), "alone at the rung it goes on: the other job's report pruned it"


@pytest.mark.e2e
@pytest.mark.slow
def test_the_slurm_path_prunes_across_processes_through_submitits_local_executor(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SUBPROCESS_ENV["PYTHONPATH"])  # the jobs' processes import run.py's module
    pruner = "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:2.0}"
    overrides = ["launcher=local", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=2", "trainer.epochs=2", pruner]
    result = _search(tmp_path, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [trial.state.name for trial in _study(tmp_path).trials] == ["PRUNED", "PRUNED"]
    for number in (0, 1):
        metrics = json.loads((tmp_path / "sweep" / str(number) / "metrics.json").read_text())
        assert metrics["pruned"] and metrics["epochs_completed"] == 1
    assert list((tmp_path / "sweep" / ".submitit").iterdir()), "the jobs ran through submitit"


@pytest.mark.e2e
@pytest.mark.slow
def test_mlflow_gets_one_parent_run_for_the_study_across_runs_of_the_command(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = ["logger=mlflow", f"logger.tracking_uri={uri}"]
    assert _search(tmp_path, "hydra.sweeper.n_trials=1", *tracking).returncode == 0
    again = _search(tmp_path, "hydra.sweeper.n_trials=2", *tracking)  # the study goes on: the same parent
    assert again.returncode == 0, again.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("vggtrain").experiment_id])
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {run.data.tags["mlflow.parentRunId"] for run in children} == {parents[0].info.run_id}
    assert parents[0].info.status == "FINISHED" and "best_objective" in parents[0].data.metrics
    assert sorted(run.info.run_name.split(":")[0] for run in children) == ["0", "1"], "named by trial number"


@pytest.mark.e2e
def test_a_cross_validated_trial_is_told_the_mean_of_its_folds(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    sweep = tmp_path / "sweep"
    arguments = [
        "-m", *tiny_overrides(data), "hparams_search=vgg19_optuna_cv", "hydra.sweeper.folds=2",
        "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    result = run_cli(arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folds = [json.loads((sweep / "0" / f"fold{fold}" / "metrics.json").read_text()) for fold in (0, 1)]
    objectives = [metrics["objective"] for metrics in folds]
    (trial,) = _study(tmp_path, "vgg19_cv").trials
    assert trial.value == pytest.approx(sum(objectives) / 2)
    (row,) = csv_rows(sweep / "folds.csv")
    assert int(row["folds"]) == 2 and float(row["objective_mean"]) == pytest.approx(trial.value)
    assert "mean of 2 folds" in result.stdout


@pytest.mark.e2e
def test_a_cross_validated_search_is_not_pruned(tmp_path):
    pruner = "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner}"
    result = _search(tmp_path, "hydra.sweeper.folds=2", pruner)
    assert result.stderr.strip().splitlines()[-1].startswith("error: hydra.sweeper.pruner: a cross-validated trial")


@pytest.mark.e2e
def test_a_trial_that_fails_is_marked_failed_and_the_search_goes_on(tmp_path):
    result = _search(tmp_path, "hydra.sweeper.n_trials=2", "model.dropout=choice(1.5)")  # every trial: bad input
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [trial.state.name for trial in _study(tmp_path).trials] == ["FAIL", "FAIL"], "the second trial ran"
    assert [row["state"] for row in csv_rows(tmp_path / "sweep" / "study.csv")] == ["failed", "failed"]
    rows = csv_rows(tmp_path / "sweep" / "summary.csv")
    assert len(rows) == 2 and all("rate=1.5" in row["error"] for row in rows), "each named, in one line"
    assert result.stderr.strip().splitlines()[-1].startswith("error: 2 of 2 jobs failed")


@pytest.mark.unit
def test_a_continued_study_draws_new_parameters_where_the_same_seed_drew_trial_0s_again(tmp_path):
    """4 trials, then the same command with n_trials=7: the sampler made with `seed` again repeats its start-up
    draws (trial 4 had trial 0's parameters); seeded from the study's history, no two trials share them."""
    from optuna.storages.journal import JournalFileBackend

    from trainer.search.sweeper import _instantiate, reseeded

    config = {"_target_": "optuna.samplers.TPESampler", "seed": 0, "n_startup_trials": 10}
    space = {"lr": optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)}
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))
    for n_trials in (4, 7):  # the first run, then the same command with a larger n_trials
        study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
        study.sampler = _instantiate(reseeded(config, len(study.trials)), "hydra.sweeper.sampler")
        while len(study.trials) < n_trials:
            trial = study.ask(space)
            study.tell(trial, trial.params["lr"])
    drawn = [trial.params["lr"] for trial in optuna.load_study(study_name="s", storage=storage).trials]
    assert len(drawn) == 7 and len(set(drawn)) == 7, drawn
    assert reseeded({"seed": None}, 4) == {"seed": None} and reseeded(config, 0) == config
