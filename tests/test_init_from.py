"""`model.init_from=RUN`: a new run from a finished run's weights; a new head for other classes; other input
sizes and networks refused with one line naming both; `resume=` of a finished run points here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import cifar_overrides, compose, run_cli
from trainer.errors import ConfigError
from trainer.models.preprocessing import build_models
from trainer.models.vgg19 import build_vgg19
from trainer.runs import checkpoints
from trainer.tasks import run_task
from trainer.tasks.init_from import start_from

OTHER_CLASSES = [f"kind{index}" for index in range(10)]


def _smoke_models():
    """A network as debug=smoke builds it on the trained run's CIFAR files (28x28 crops, width 0.125, fc 64)."""
    network = build_vgg19(10, (28, 28, 3), width_multiplier=0.125, fc_units=64)
    return build_models(network)


def _weights(model) -> dict[str, list[np.ndarray]]:
    from trainer.models.transfer import _weighted

    return {name: layer.get_weights() for name, layer in _weighted(model).items()}


@pytest.mark.unit
@pytest.mark.parametrize("classes", ["same", "other"])
def test_every_layer_starts_from_the_runs_weights_and_other_classes_get_a_new_head(trained_run, classes):
    import tensorflow as tf

    _, run_dir = trained_run
    source, info = checkpoints.load(run_dir)
    models = _smoke_models()
    names = list(info.class_names) if classes == "same" else OTHER_CLASSES
    start = start_from(str(run_dir), models, names, tf.distribute.get_strategy())
    assert start == {"file": str(run_dir / checkpoints.BEST), "epoch": info.epoch, "new_head": classes == "other"}
    theirs, ours = _weights(source), _weights(models.inference)
    assert theirs.keys() == ours.keys()
    for name in ours:
        same = all(np.array_equal(a, b) for a, b in zip(theirs[name], ours[name], strict=True))
        assert same == (name != "predictions" or classes == "same"), name


@pytest.mark.slow
@pytest.mark.integration
def test_init_from_trains_a_new_run_on_from_a_finished_run_and_records_it(trained_run, tmp_path, caplog):
    data, run_dir = trained_run
    caplog.set_level("INFO", logger="trainer")
    overrides = [*cifar_overrides(data), f"model.init_from={run_dir}", "trainer.epochs=1"]
    run_task(compose(overrides, tmp_path / "next"))
    metrics = json.loads((tmp_path / "next" / "metrics.json").read_text())
    epoch = checkpoints.read_info(run_dir / checkpoints.BEST).epoch
    assert metrics["init_from"] == {"file": str(run_dir / checkpoints.BEST), "epoch": epoch, "new_head": False}
    assert f"Starting from {run_dir / checkpoints.BEST} (epoch {epoch}): all " in caplog.text
    assert (tmp_path / "next" / "checkpoints" / "best.keras").is_file()
    assert not (run_dir / "metrics.json").read_text() == (tmp_path / "next" / "metrics.json").read_text()


@pytest.mark.slow
@pytest.mark.integration
def test_other_classes_get_a_new_head_and_train_it_alone_first_with_freeze_epochs(trained_run, tmp_path, caplog):
    data, run_dir = trained_run
    caplog.set_level("INFO", logger="trainer")
    overrides = [
        *cifar_overrides(data),
        f"model.init_from={run_dir}",
        f"dataset.class_names=[{','.join(OTHER_CLASSES)}]",
        "finetune.freeze_epochs=1",
        "finetune.unfreeze_from=all",
        "trainer.epochs=2",
        "evaluate.report=false",
    ]
    run_task(compose(overrides, tmp_path / "other"))
    heads = [line for line in caplog.text.splitlines() if "the head (predictions) is new" in line]
    assert len(heads) == 1 and "[kind0, kind1, kind2, kind3, kind4, ... (10 classes)]" in heads[0]
    assert "Epochs 1-1: 0 base layers train" in caplog.text  # the new head alone on the frozen network
    assert "Epochs 2-2: 53 base layers train, lr x 0.1" in caplog.text  # then all (finetune.unfreeze_from=all)
    metrics = json.loads((tmp_path / "other" / "metrics.json").read_text())
    assert metrics["init_from"]["new_head"] is True and metrics["epochs_completed"] == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "dataset.augment.crop=none",
            "its model takes 28x28 images, this run's 32x32: set dataset.image_size (and any crop) so that the "
            "model sees 28 pixels",
        ),
        (
            "model.width_multiplier=0.25",
            "is not this run's vgg19 (",
        ),
    ],
    ids=["input size", "network"],
)
def test_another_input_size_or_network_is_one_line_naming_both(trained_run, tmp_path, override, expected):
    data, run_dir = trained_run
    result = run_cli([*cifar_overrides(data), f"model.init_from={run_dir}", override, f"hydra.run.dir={tmp_path}"])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: model.init_from={run_dir}: ") and expected in lines[0]
    if override.startswith("model."):
        assert "its network vgg19 (" in lines[0]
        assert "layer block1_conv1's kernel is (3, 3, 3, 8) there and (3, 3, 3, 16) here" in lines[0]


@pytest.mark.unit
def test_a_missing_run_is_one_line_before_any_data_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"model.init_from=.*nowhere: no such run folder or .keras file"):
        run_task(compose(["dataset=folder", f"dataset.data_dir={tmp_path / 'no_data'}",
                          f"model.init_from={tmp_path / 'nowhere'}"], tmp_path / "run"))  # fmt: skip
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="the folder holds no checkpoints/best.keras"):
        run_task(compose(["dataset=folder", f"dataset.data_dir={tmp_path / 'no_data'}",
                          f"model.init_from={tmp_path / 'empty'}"], tmp_path / "run"))  # fmt: skip


@pytest.mark.unit
def test_the_model_card_says_what_the_run_started_from():
    from trainer.serving import model_card

    info = {"class_names": ["a", "b"], "dataset": "folder", "files": {"onnx": {}}, "output": {"temperature": None}}
    info.update(image_size=32, resize_to=32, resize_mode="resize", normalization="standardize")
    start = {"file": "outputs/2026-12-01/10-00-00/checkpoints/best.keras", "epoch": 7, "new_head": True}
    run = model_card.RunRecord(folder="outputs/x", metrics={"init_from": start})
    card = model_card.render(info, run)
    assert "- Started from: `outputs/2026-12-01/10-00-00/checkpoints/best.keras` (its epoch 7; a new head" in card
    assert "Started from" not in model_card.render(info, model_card.RunRecord(folder="outputs/x", metrics={}))
