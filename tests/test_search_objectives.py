"""The search's objectives and what it shows of them, in process and without training: the directions and metrics
checks, the refusal of a latency objective whose model cannot be exported, the Pareto front's plot and run folders,
summary.csv's objective columns, TensorBoard's typed HParams, and the pruning presets.

The searches that train are in tests/test_search.py (e2e, slow where they must be)."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason='needs the sweep extra: pip install -e ".[sweep]"')


def _study(tmp_path: Path, directions: list[str]):
    from trainer.search.study import open_storage, open_study

    return open_study("s", open_storage(str(tmp_path / "s.journal")), directions, None, None)


# --- directions and metrics -----------------------------------------------------------------------------------


def _sweeper(objective: dict, **options):
    from omegaconf import OmegaConf

    from trainer.search.sweeper import OptunaSearch

    settings = {"direction": "maximize", "study_name": None, "storage": None, "n_trials": 2, "n_jobs": 1}
    settings |= {"sampler": None, "pruner": None, "params": None} | options
    sweeper = OptunaSearch(**settings)
    sweeper.config = OmegaConf.create({"objective": objective, "hydra": {"launcher": {"_target_": "basic"}}})
    return sweeper


@pytest.mark.unit
@pytest.mark.parametrize(
    "objective, options, expected",
    [
        ({"metric": "val_accuracy"}, {}, (["maximize"], ["val_accuracy"])),
        (
            {"metric": "val_accuracy", "metrics": ["val_accuracy", "latency_ms"]},
            {"directions": ["maximize", "minimize"]},
            (["maximize", "minimize"], ["val_accuracy", "latency_ms"]),
        ),
        (  # the sweeper's own older key still works
            {"metric": "val_accuracy"},
            {"direction": ["maximize", "minimize"], "metrics": ["val_accuracy", "train_seconds"]},
            (["maximize", "minimize"], ["val_accuracy", "train_seconds"]),
        ),
    ],
)
def test_the_objectives_are_one_metric_per_direction(objective, options, expected):
    assert _sweeper(objective, **options)._objectives() == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    "objective, options, message",
    [
        (
            {"metric": "val_accuracy", "metrics": ["val_accuracy"]},
            {"directions": ["maximize", "minimize"]},
            "objective.metrics=['val_accuracy'] names 1 metrics and hydra.sweeper.directions=['maximize', 'minimize'] "
            "2 directions: give one direction per metric",
        ),
        (
            {"metric": "val_accuracy", "metrics": ["val_accuracy", "latency_ms"]},
            {},
            "objective.metrics=['val_accuracy', 'latency_ms'] names 2 metrics and hydra.sweeper.direction=['maximize'] "
            "1 directions: give one direction per metric",
        ),
        (
            {"metric": "val_accuracy", "metrics": ["val_accuracy", "latency_ms"]},
            {"directions": ["maximize", "minimize"], "pruner": {"_target_": "optuna.pruners.MedianPruner"}},
            "hydra.sweeper.pruner: Optuna prunes single-objective studies only; set it to null",
        ),
        ({"metric": "val_accuracy"}, {"directions": ["maximize", "fastest"]}, "hydra.sweeper.directions must be"),
    ],
)
def test_directions_and_metrics_that_do_not_pair_are_one_line(objective, options, message):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        _sweeper(objective, **options)._objectives()
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def lambda_model(num_classes, input_shape):
    """A custom model that trains but cannot be served: a Lambda layer, which Keras's safe mode does not load."""
    import keras

    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Lambda(lambda images: images / 255.0)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def _latency_sweeper(target: str, tmp_path: Path):
    sweeper = _sweeper({"metric": "val_accuracy", "metrics": ["val_accuracy", "latency_ms"]},
                       directions=["maximize", "minimize"])  # fmt: skip
    sweeper.config.model = {"_target_": target, "name": "custom"}
    sweeper.config.dataset = {"image_size": 32}
    sweeper.config.hydra.sweep = {"dir": str(tmp_path / "sweep")}
    return sweeper


@pytest.mark.unit
def test_a_latency_objective_with_a_model_that_cannot_be_exported_is_one_line_before_any_trial(tmp_path):
    sweeper = _latency_sweeper("test_search_objectives.lambda_model", tmp_path)
    with pytest.raises(SystemExit) as raised:
        sweeper.sweep([])
    line = str(raised.value)
    assert line.startswith("error: objective.metrics: latency_ms is measured on the exported SavedModel, and "
                           "model._target_=test_search_objectives.lambda_model cannot be exported: ")  # fmt: skip
    assert "Lambda" in line and "\n" not in line
    assert not (tmp_path / "sweep").exists(), "no study, no trial"


@pytest.mark.integration
@pytest.mark.slow  # exports a SavedModel and loads it back: ~20 s on a loaded 2-core machine
def test_a_latency_objective_with_a_servable_model_passes_the_check(tmp_path):
    _latency_sweeper("tiny_model.build", tmp_path)._check_servable(["val_accuracy", "latency_ms"])


# --- the Pareto front -----------------------------------------------------------------------------------------

POINTS = [(0.90, 5.0), (0.95, 9.0), (0.93, 12.0), (0.97, 20.0), (0.85, 4.0)]  # (accuracy, latency): 2 dominated


def _front_study(tmp_path: Path):
    from optuna.distributions import FloatDistribution

    from trainer.search.study import RUN_DIRS

    study = _study(tmp_path, ["maximize", "minimize"])
    for number, values in enumerate(POINTS):
        trial = study.ask({"x": FloatDistribution(0, 1)})
        trial.set_user_attr(RUN_DIRS, [str(tmp_path / "sweep" / str(number))])
        study.tell(trial, values=list(values))
    return study


@pytest.mark.unit
def test_the_report_draws_the_pareto_front_as_a_line_and_lists_its_trials_with_their_run_folders(tmp_path):
    from trainer.search.report import plot_pareto_front, write_report

    study = _front_study(tmp_path)
    axes = plot_pareto_front(study, ["val_accuracy", "latency_ms"])
    points, line = axes.collections[0].get_offsets(), axes.get_lines()[0]
    assert sorted(map(tuple, points.tolist())) == sorted((latency, accuracy) for accuracy, latency in POINTS)
    front = [(4.0, 0.85), (5.0, 0.90), (9.0, 0.95), (20.0, 0.97)]  # (0.93, 12 ms) is dominated by (0.95, 9 ms)
    assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == front
    assert axes.get_xlabel() == "latency_ms (minimize)" and axes.get_ylabel() == "val_accuracy (maximize)"

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_report(study, sweep, ["val_accuracy", "latency_ms"])
    with open(sweep / "best.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(row["trial"]) for row in rows) == [0, 1, 3, 4]
    assert all(row["run_dir"] == str(sweep / row["trial"]) for row in rows)
    assert all(row["latency_ms"] and row["val_accuracy"] for row in rows)
    assert (sweep / "pareto_front.png").stat().st_size > 10_000


@pytest.mark.unit
def test_the_end_of_a_search_logs_the_front_with_its_run_folders(tmp_path, caplog):
    study = _front_study(tmp_path)
    sweeper = _sweeper({"metric": "val_accuracy"}, directions=["maximize", "minimize"])
    with caplog.at_level(logging.INFO, logger="trainer.search.sweeper"):
        sweeper._log_best(study, ["val_accuracy", "latency_ms"])
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4 and all(line.startswith("Pareto front (4 trials)") for line in lines)
    assert f"-> {tmp_path / 'sweep' / '1'}" in " ".join(lines) and "latency_ms=9.0000" in " ".join(lines)


# --- summary.csv and TensorBoard ------------------------------------------------------------------------------


@pytest.mark.unit
def test_summary_csv_holds_every_objective_of_the_search():
    from trainer.tracking.sweep import COLUMNS, summary_columns

    assert summary_columns(None) == COLUMNS
    assert summary_columns(["val_accuracy", "latency_ms"]) == [*COLUMNS, "latency_ms"]


def _hparams_config(log_dir: Path):
    import tensorflow as tf
    from tensorboard.plugins.hparams import plugin_data_pb2

    for events in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("experiment"):
                        return {info.name: info for info in data.experiment.hparam_infos}
    return {}


@pytest.mark.unit
def test_tensorboard_hparams_show_a_searchs_integers_as_integers_and_choices_as_choices(tmp_path):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from trainer.search.report import write_space
    from trainer.tracking.sweep import read_space, swept_keys, write_hparams_config

    space = {
        "trainer.batch_size": CategoricalDistribution([32, 64, 128]),
        "trainer.epochs": IntDistribution(2, 8, step=2),
        "optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "model.width_multiplier": CategoricalDistribution([0.125, 0.25]),
        "optimizer": CategoricalDistribution(["adam", "sgd"]),
    }
    write_space(tmp_path, space)
    rows = [  # what summary.csv holds of two trials: the overrides' texts
        {"overrides": "trainer.batch_size=32 trainer.epochs=2 optimizer.lr=0.001 model.width_multiplier=0.125"},
        {"overrides": "trainer.batch_size=128 trainer.epochs=8 optimizer.lr=0.05 model.width_multiplier=0.25"},
    ]
    write_hparams_config(tmp_path / "tensorboard", swept_keys(rows), ["objective"], read_space(tmp_path))
    infos = _hparams_config(tmp_path / "tensorboard")

    def listed(name: str) -> list:
        return [value.number_value or value.string_value for value in infos[name].domain_discrete.values]

    assert listed("trainer.batch_size") == [32, 64, 128], "a choice of batch sizes is its three values"
    assert listed("trainer.epochs") == [2, 4, 6, 8], "an integer range is its integers"
    assert listed("model.width_multiplier") == [0.125, 0.25]
    assert listed("optimizer") == ["adam", "sgd"]
    interval = infos["optimizer.lr"].domain_interval
    assert (interval.min_value, interval.max_value) == pytest.approx((1e-4, 1e-1))
    assert json.loads((tmp_path / "space.json").read_text())["trainer.epochs"]  # optuna's own JSON of each


# --- the pruning presets --------------------------------------------------------------------------------------


def _preset(preset: str):
    """hydra.sweeper of `hparams_search=PRESET` (trainer.epochs=12), composed as `python run.py -m` composes it."""
    from hydra import compose, initialize_config_dir

    import hydra_plugins.vggtrain_optuna_sweeper  # noqa: F401 - registers hydra/sweeper=vggtrain_optuna
    from conftest import CONF
    from trainer.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        overrides = [f"hparams_search={preset}", "trainer.epochs=12"]
        return compose("config", overrides=overrides, return_hydra_config=True)


@pytest.mark.unit
@pytest.mark.parametrize("preset", ["vgg19_asha", "vgg19_hyperband"])
def test_a_pruning_preset_spans_three_decades_of_lr_and_judges_no_trial_before_its_second_epoch(preset):
    from omegaconf import OmegaConf

    from trainer.search.space import parse_space
    from trainer.targets import build_target

    composed = _preset(preset)
    sweeper = composed.hydra.sweeper
    assert composed.objective.prune_metric == "accuracy", "told the training accuracy: it ranks from epoch 2"
    space = parse_space(OmegaConf.to_container(sweeper.params), [])
    lr = space.distributions["optimizer.lr"]
    assert lr.log and round(math.log10(lr.high / lr.low), 6) >= 3, "three decades"
    assert {"model.weight_decay", "model.dropout", "model.width_multiplier"} <= set(space.distributions)
    assert space.fixed.get("trainer.batch_size"), "an epoch, the pruner's unit, is the same steps for every trial"
    options = OmegaConf.to_container(sweeper.pruner, resolve=True)
    assert options["min_resource"] >= 1, "Optuna's steps are epoch indices: step 1 ends the second epoch"
    pruner = build_target("hydra.sweeper.pruner", options.pop("_target_"), options)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    first_epoch_judged = []
    for values in ([0.9, 0.95, 0.97], [0.1, 0.2, 0.3], [0.05, 0.1, 0.15]):  # a good start, then slow starters
        trial = study.ask()
        for step, value in enumerate(values):
            trial.report(value, step)
            if step == 0:
                first_epoch_judged.append(trial.should_prune())
        study.tell(trial, values[-1])
    assert first_epoch_judged == [False, False, False]


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "val_accuracy"),  # the objective's own
        (["objective.prune_metric=accuracy"], "accuracy"),
        (["objective.metric=val_loss", "objective.mode=min", "objective.prune_metric=loss"], "loss"),
        (
            ["objective.prune_metric=loss"],
            "objective.prune_metric must be one of ['accuracy', 'val_accuracy'] with objective.mode=max (the pruner "
            "compares it in the study's direction); got 'loss'",
        ),
        (["objective.prune_metric=acc"], "objective.prune_metric must be one of ['accuracy', 'val_accuracy']"),
        (
            ["objective.metric=accuracy", "trainer.validate=false", "objective.prune_metric=val_accuracy"],
            "trainer.validate=false leaves no val_accuracy for objective.prune_metric",
        ),
    ],
)
def test_the_pruner_is_told_the_prune_metric_in_the_studys_direction(overrides, expected):
    from conftest import compose
    from trainer.config import to_settings
    from trainer.errors import ConfigError
    from trainer.tasks.train import _prune_metric

    if expected.startswith(("objective.", "trainer.")):
        with pytest.raises(ConfigError) as error:
            settings = to_settings(compose(overrides))
            _prune_metric(settings, settings.objective.metric)
        assert str(error.value).startswith(expected) and "\n" not in str(error.value)
    else:
        settings = to_settings(compose(overrides))
        assert _prune_metric(settings, settings.objective.metric) == expected


@pytest.mark.unit
def test_a_prune_metric_of_the_other_direction_is_one_line_before_any_trial():
    """Each trial refused it in turn, and the sweep ended with every job failed."""
    from trainer.errors import ConfigError

    pruner = {"_target_": "optuna.pruners.MedianPruner"}
    objective = {"metric": "val_accuracy", "mode": "max", "prune_metric": "val_loss"}
    with pytest.raises(ConfigError, match=r"^objective.prune_metric must be one of \['accuracy', 'val_accuracy'\]"):
        _sweeper(objective, pruner=pruner)._objectives()
    assert _sweeper({**objective, "prune_metric": "accuracy"}, pruner=pruner)._objectives()[1] == ["val_accuracy"]


@pytest.mark.unit
def test_a_study_whose_pruner_was_told_another_metric_is_not_continued(tmp_path):
    """Its rungs would have compared the old trials' val_accuracy with the new ones' training accuracy."""
    from trainer.errors import ConfigError
    from trainer.search.study import PRUNED_ON, check_pruned_on

    study = _study(tmp_path, ["maximize"])
    check_pruned_on(study, "s", "accuracy", "val_accuracy")  # nothing reported yet: any metric, recorded
    assert study.user_attrs[PRUNED_ON] == "accuracy"
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.study_name: study 's' told its pruner accuracy each "):
        check_pruned_on(study, "s", "val_accuracy", "val_accuracy")
    older = _study(tmp_path / "older", ["maximize"])  # a study from before objective.prune_metric
    trial = older.ask()
    trial.report(0.5, 0)
    older.tell(trial, 0.5)
    with pytest.raises(ConfigError, match=r"told its pruner val_accuracy each epoch, and this search would tell it "):
        check_pruned_on(older, "s", "accuracy", "val_accuracy")
    check_pruned_on(older, "s", "val_accuracy", "val_accuracy")
