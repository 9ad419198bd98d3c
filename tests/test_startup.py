"""What `python run.py` does before its first training step (issue 52 part 5): Hydra composes the config once, for
the command's own check, not three times (upstream hydra#3440: `get_mode` composes it only to read `hydra.mode`); the
checks that only the end needs (every record's label, the report's two classes) run after the first step, and
still stop the run with their one line before anything is saved.

    python -m benchmarks --only startup
"""

from __future__ import annotations

import pytest

from conftest import CIFAR_TRAIN, run_cli


def _composes(monkeypatch) -> list:
    """Counts Hydra's config loads (what a compose costs) from now on: their run modes."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls, original = [], ConfigLoaderImpl.load_configuration

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counting)
    return calls


@pytest.mark.integration
def test_hydra_composes_the_config_once_the_commands_check(monkeypatch, tmp_path):
    import trainer.tasks

    calls = _composes(monkeypatch)
    monkeypatch.setattr(trainer.tasks, "run_task", lambda cfg, **_: 0.5)  # the task is not the point
    result = run_cli(["debug=smoke", "trainer.epochs=2", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(calls) == 1, f"our check's, which Hydra's get_mode and run take: {calls}"


def _what_the_task_gets(monkeypatch, tmp_path, arguments: list[str], name: str) -> tuple[str, str]:
    """(the job's config, Hydra's config) as YAML, as the task got them, the run folder's name made the same."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    import trainer.tasks

    got = {}

    def task(cfg, **_):
        hydra = OmegaConf.to_container(HydraConfig.get(), resolve=False)
        hydra["run"]["dir"] = hydra["runtime"]["output_dir"] = "RUN"
        folder = str(tmp_path / name)
        hydra["overrides"]["hydra"] = [item.replace(folder, "RUN") for item in hydra["overrides"]["hydra"]]
        got["yaml"] = OmegaConf.to_yaml(cfg, resolve=False), OmegaConf.to_yaml(hydra)
        return 0.5

    monkeypatch.setattr(trainer.tasks, "run_task", task)
    result = run_cli([*arguments, f"hydra.run.dir={tmp_path / name}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    return got["yaml"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "arguments",
    [
        ["debug=smoke"],
        ["dataset=cifar", "trainer.epochs=2", "+tags=[a]", "hydra.verbose=true"],
        ["hparams_search=vgg19_optuna", "hydra.mode=RUN", "optimizer.lr=0.1"],  # Hydra composes its own
    ],
)
def test_the_config_hydras_run_takes_from_the_check_is_the_one_it_would_compose(monkeypatch, tmp_path, arguments):
    """The check's compose given to Hydra's run (`trainer.cli.hydra_mode.composed_once`) against Hydra's own: the
    job's config and Hydra's, its overrides and mode included, are the same."""
    import trainer.cli.main
    from trainer.cli.hydra_mode import UNKNOWN

    once = _what_the_task_gets(monkeypatch, tmp_path, arguments, "once")
    monkeypatch.setattr(trainer.cli.main, "check_composes", lambda *_: UNKNOWN)  # Hydra composes, twice
    assert once == _what_the_task_gets(monkeypatch, tmp_path, arguments, "hydras")


@pytest.mark.unit
@pytest.mark.parametrize(
    "arguments, mode, reused",
    [
        (["debug=smoke"], None, True),  # the config leaves it to the command line: run, or -m
        (["debug=smoke", "-m"], None, False),  # a flag: Hydra's sweep composes its own
        (["hparams_search=vgg19_optuna"], "MULTIRUN", True),  # the preset sets hydra.mode
        (["hydra.mode=MULTIRUN"], "unknown", False),  # Hydra's own setting: Hydra reads it
        (["optimizer.lr=0.1,0.01"], "unknown", False),  # a sweep of values
    ],
)
def test_the_commands_check_gives_hydra_the_mode_its_compose_found(arguments, mode, reused):
    from trainer.cli.hydra_mode import UNKNOWN
    from trainer.cli.main import CONFIG_DIR
    from trainer.cli.overrides import check_composes

    found = check_composes(arguments, CONFIG_DIR)
    assert ("unknown" if found is UNKNOWN else None if found.mode is None else found.mode.name) == mode
    assert (found is not UNKNOWN and found.overrides is not None) == reused


@pytest.mark.unit
def test_late_checks_run_once_after_the_first_step_not_before_it():
    from trainer.tasks.plan import LateChecks
    from trainer.training.callbacks import AfterFirstStep

    ran = []
    late = LateChecks([lambda: ran.append("labels"), lambda: ran.append("report split")])
    callback = AfterFirstStep(late.run)
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    callback.on_train_batch_begin(0)
    assert ran == [], "the first step waits for none of them"
    callback.on_train_batch_end(0)
    assert ran == ["labels", "report split"]
    callback.on_train_batch_end(1)
    late.run()  # the test evaluation's call: done already
    assert ran == ["labels", "report split"], "each once"


def _bad_label_run(tmp_path, labels: dict[str, list[int]]):
    """A tiny training run whose CIFAR files hold `labels` (file name -> its labels; 12 is out of range)."""
    import numpy as np

    from conftest import pattern_records, train_arguments

    run_dir = tmp_path / "run"
    arguments = train_arguments(tmp_path, run_dir, epochs=1)
    for name, values in labels.items():
        (tmp_path / "cifar" / name).write_bytes(pattern_records(np.array(values)))
    return run_cli(arguments, cwd=tmp_path), run_dir


@pytest.mark.integration
def test_a_test_label_out_of_range_stops_the_run_after_its_first_step_before_anything_is_saved(tmp_path):
    """Every record's label is checked after the first step (`trainer.tasks.plan.LateChecks`), not before it: a
    test record out of range still stops the run with the start-up check's one line, before the epoch's
    history row or any checkpoint is written."""
    result, run_dir = _bad_label_run(tmp_path, {"test_batch.bin": [1, 2, 3, 4, 5, 12, 6, 7]})
    assert result.returncode == 1
    bad = tmp_path / "cifar" / "test_batch.bin"
    expected = f"error: {bad}: record 5 has label 12, expected 0 to 9 (dataset.num_classes=10)"
    assert result.stderr.strip().splitlines()[-1] == expected
    assert "First training step done" in (run_dir / "run.log").read_text(), "checked in the first step's shadow"
    assert not (run_dir / "history.csv").exists(), "no epoch was saved"
    assert not list((run_dir / "checkpoints").glob("*.keras")), "no checkpoint was saved"
    assert not (run_dir / "metrics.json").exists()


@pytest.mark.integration
def test_a_bad_label_the_first_batch_meets_before_the_check_is_the_checks_own_line(tmp_path):
    """A label out of range in the first training batch stops the pipeline before the late check runs: the line
    is the same, naming the first bad file and record (`Splits.find_bad_record` runs the check)."""
    result, run_dir = _bad_label_run(tmp_path, {name: [12] * 16 for name in CIFAR_TRAIN})  # every batch is bad
    assert result.returncode == 1
    bad = tmp_path / "cifar" / CIFAR_TRAIN[0]
    expected = f"error: {bad}: record 0 has label 12, expected 0 to 9 (dataset.num_classes=10)"
    assert result.stderr.strip().splitlines()[-1] == expected
    assert "First training step done" not in (run_dir / "run.log").read_text()


@pytest.mark.integration
def test_a_resume_refused_for_a_bad_label_leaves_the_runs_data_record_as_it_was(tmp_path, monkeypatch):
    """A resume checks every record's label before it binds the run to the data (`RUN/data.json`): checked after
    the first step, a refused resume with allow_data_change=true had already rewritten what the run trained on,
    and a later resume on the good data was refused as 'other content' (found by the red team)."""
    import numpy as np

    from conftest import pattern_records, run_patched, stop_after_steps, train_arguments

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:  # preempted in this process after its first step
        stop_after_steps(patched, 1)
        stopped = run_patched(tmp_path, train_arguments(tmp_path, run_dir, epochs=2))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    recorded = (run_dir / "data.json").read_bytes()
    (tmp_path / "cifar" / "test_batch.bin").write_bytes(pattern_records(np.array([1, 2, 3, 4, 5, 12, 6, 7])))
    result = run_patched(tmp_path, [f"resume={run_dir}", "allow_data_change=true"])
    assert result.returncode == 1
    assert "record 5 has label 12" in result.stderr.strip().splitlines()[-1]
    assert (run_dir / "data.json").read_bytes() == recorded
