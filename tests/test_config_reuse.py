"""A run folder's saved config is reused by evaluate/predict/export/inspect, with the typed overrides on top."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose
from trainer.config import VGG19ImageNetConfig, to_settings
from trainer.config import reuse as run_config
from trainer.data.formats.binary import BinaryFiles
from trainer.data.formats.tfrecord import TFRecordFiles
from trainer.errors import ConfigError
from trainer.tasks import with_run_config

pytestmark = pytest.mark.unit


def _save_run(run_dir: Path, overrides: list[str]) -> Path:
    """A run folder as Hydra leaves it: `.hydra/config.yaml` holds the composed config."""
    cfg = compose(overrides, output_dir=run_dir)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return run_dir


def test_evaluate_of_a_run_reuses_its_dataset_and_model(tmp_path):
    run = _save_run(tmp_path / "run", ["dataset=cifar", "dataset.data_dir=/data/c10", "model.dropout=0.2"])
    typed = ["mode=evaluate", f"checkpoint={run}"]
    settings = to_settings(with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed))
    assert isinstance(settings.dataset, BinaryFiles)
    assert settings.dataset.name == "cifar" and settings.dataset.data_dir == "/data/c10"
    assert settings.model.dropout == 0.2
    assert settings.mode == "evaluate" and settings.output_dir == str(tmp_path / "eval")


def test_typed_keys_win_key_by_key(tmp_path):
    run = _save_run(tmp_path / "run", ["dataset=cats_dogs", "dataset.data_dir=/records", "model=vgg19_imagenet"])
    checkpoint = f"checkpoint={run}/checkpoints/best.keras"
    typed = ["mode=evaluate", checkpoint, "dataset.data_dir=/copy", "evaluate.split=val"]
    merged, overridden = run_config.reuse(compose(typed, output_dir=tmp_path / "eval"), run, typed)
    settings = to_settings(merged)
    assert isinstance(settings.dataset, TFRecordFiles) and isinstance(settings.model, VGG19ImageNetConfig)
    assert settings.dataset.train_files == ["/copy/train.tfrecords_*"]  # the run's glob, with the typed folder
    assert settings.evaluate.split == "val"
    assert overridden == ["dataset.data_dir", "evaluate.split"]


def test_a_bare_keras_file_uses_the_command_line(tmp_path):
    model = tmp_path / "model.keras"
    model.write_bytes(b"")
    typed = ["mode=evaluate", f"checkpoint={model}", "dataset=cifar"]
    cfg = compose(typed, output_dir=tmp_path / "eval")
    assert run_config.run_folder_of(str(model)) is None
    assert with_run_config(cfg, typed) is cfg


def test_training_ignores_checkpoint_run_folders(tmp_path):
    run = _save_run(tmp_path / "run", ["dataset=cifar"])
    cfg = compose([f"checkpoint={run}"], output_dir=tmp_path / "train")
    assert with_run_config(cfg, []) is cfg


def test_a_damaged_saved_config_is_one_error_naming_the_file(tmp_path):
    run = _save_run(tmp_path / "run", [])
    (run / ".hydra" / "config.yaml").write_text("dataset: {name: x, bogus_key: 1}\n")
    typed = ["mode=evaluate", f"checkpoint={run}"]
    with pytest.raises(ConfigError, match=r"config\.yaml: its `dataset` section fits no dataset schema"):
        with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed)


@pytest.mark.parametrize("preset", ["debug=smoke", "experiment=cifar_vgg19"])
def test_a_preset_on_top_of_a_saved_run_is_one_error_not_ignored(tmp_path, preset):
    run = _save_run(tmp_path / "run", ["dataset=cifar"])
    choices = "hydra:\n  runtime:\n    choices:\n"
    (run / ".hydra" / "hydra.yaml").write_text(choices + "      debug: null\n      experiment: null\n")
    typed = ["mode=evaluate", f"checkpoint={run}", preset]
    key, value = preset.split("=")
    with pytest.raises(ConfigError, match=rf"{preset}: .* was made with {key}=None, and a preset cannot be laid over"):
        with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed)
    (run / ".hydra" / "hydra.yaml").write_text(choices + f"      {key}: {value}\n")
    assert with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed).mode == "evaluate"  # the same one


def test_a_relative_data_dir_of_a_reused_run_is_the_one_it_was_launched_with(tmp_path, monkeypatch, caplog):
    """`mode=export|evaluate checkpoint=RUN` run from another folder read a relative `dataset.data_dir` of the
    run's config against today's folder: other data of the same name, evaluated silently."""
    launched, elsewhere = tmp_path / "launched", tmp_path / "elsewhere"
    for folder in (launched, elsewhere):
        (folder / "photos").mkdir(parents=True)
    run = _save_run(tmp_path / "run", ["dataset=folder", "dataset.data_dir=photos", "dataset.val_fraction=0.2"])
    OmegaConf.save({"hydra": {"runtime": {"cwd": str(launched)}}}, run / ".hydra" / "hydra.yaml")
    monkeypatch.chdir(elsewhere)

    def data_dir(*extra: str) -> str:
        typed = ["mode=evaluate", f"checkpoint={run}", *extra]
        return to_settings(with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed)).dataset.data_dir

    assert data_dir() == str(launched / "photos"), "the run's own data"
    assert data_dir("dataset.data_dir=photos") == "photos", "typed now: relative to today's folder"
    monkeypatch.chdir(launched)
    assert data_dir() == "photos", "launched here: nothing to anchor"
    (launched / "photos").rmdir()
    monkeypatch.chdir(elsewhere)
    assert data_dir() == "photos" and "is gone, so" in caplog.text, "the run's data gone: today's, said in a line"


def test_a_typed_value_that_does_not_resolve_is_one_line_against_a_run(tmp_path):
    """`resume=RUN trainer.epochs=${oops}` (and evaluate of a run) was a traceback from OmegaConf (red team)."""
    run = _save_run(tmp_path / "run", [])
    typed = ["mode=evaluate", f"checkpoint={run}", "evaluate.split=${oops}"]
    with pytest.raises(ConfigError, match=r"^evaluate\.split: Interpolation key 'oops' not found$"):
        with_run_config(compose(typed, output_dir=tmp_path / "eval"), typed)


def _folder_run(tmp_path: Path) -> Path:
    """A run made with dataset=folder: its saved config, and the options Hydra recorded (`hydra.yaml`)."""
    run = _save_run(tmp_path / "run", ["dataset=folder", f"dataset.data_dir={tmp_path / 'photos'}"])
    OmegaConf.save(
        {"hydra": {"runtime": {"choices": {"dataset": "folder", "model": "vgg19"}}}}, run / ".hydra" / "hydra.yaml"
    )
    return run


def test_a_key_of_the_runs_own_dataset_is_composed_with_the_runs_option(tmp_path):
    """`dataset.val_fraction` is a key of dataset=folder, not of the default dataset: a command on a folder run
    composes the run's option (the helper's `mode=evaluate checkpoint=RUN dataset.val_fraction=0.3` was refused
    as no key of the default's)."""
    run = _folder_run(tmp_path)
    typed = ["mode=evaluate", f"checkpoint={run}", "dataset.val_fraction=0.3"]
    arguments = run_config.with_run_options(typed)
    assert arguments == ["dataset=folder", *typed]
    settings = to_settings(with_run_config(compose(arguments, output_dir=tmp_path / "eval"), arguments))
    assert settings.dataset.data_dir == str(tmp_path / "photos") and settings.dataset.val_fraction == 0.3
    untouched = [
        ["mode=train", f"checkpoint={run}", "dataset.val_fraction=0.3"],
        ["mode=evaluate", f"checkpoint={run}"],
    ]
    for typed in [*untouched, ["mode=evaluate", f"checkpoint={run}", "dataset=cifar", "dataset.data_dir=/c"]]:
        assert run_config.with_run_options(typed) == typed


def test_naming_the_runs_own_option_keeps_its_section(tmp_path):
    """`dataset=folder` on a folder run keeps the run's dataset (its data_dir): only the keys typed under it
    change; another option is another dataset, taken whole from the command line."""
    run = _folder_run(tmp_path)
    typed = ["mode=evaluate", f"checkpoint={run}", "dataset=folder", "dataset.resize_mode=crop"]
    merged, overridden = run_config.reuse(compose(typed, output_dir=tmp_path / "eval"), run, typed)
    settings = to_settings(merged)
    assert settings.dataset.data_dir == str(tmp_path / "photos") and settings.dataset.resize_mode.value == "crop"
    assert overridden == ["dataset.resize_mode"]
    other = ["mode=evaluate", f"checkpoint={run}", "dataset=cifar", "dataset.data_dir=/c"]
    assert isinstance(to_settings(run_config.reuse(compose(other), run, other)[0]).dataset, BinaryFiles)
