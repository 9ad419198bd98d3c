"""The run's backup: its metadata copies, the weights it keeps, its link to last.keras, what it restores; file modes."""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import pytest

from trainer.errors import ConfigError
from trainer.runs.atomic import write_atomic, write_json
from trainer.runs.backup import METADATA, PREVIOUS, RunBackup, read_state, restore


def _backup_model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.unit
def test_a_truncated_backup_metadata_falls_back_to_its_bkp_copy(tmp_path):
    model = _backup_model()
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(model)
    backup.save(1)
    first = model.get_weights()
    model.set_weights([weight + 1 for weight in first])
    backup.save(2)
    assert read_state(tmp_path / "backup").epoch == 2
    metadata = tmp_path / "backup" / METADATA
    metadata.write_text(metadata.read_text()[:7])  # a torn write, as an older Keras or a full disk leaves it
    state = read_state(tmp_path / "backup")
    assert state.epoch == 1 and state.metadata.name == PREVIOUS
    model.set_weights([np.zeros_like(weight) for weight in first])
    backup.on_train_begin()
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), first, strict=True)), "epoch 1's weights"


@pytest.mark.unit
def test_a_backup_with_both_metadata_copies_unreadable_is_one_clear_error(tmp_path):
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(_backup_model())
    backup.save(1)
    backup.save(2)
    for name in (METADATA, PREVIOUS):
        (tmp_path / "backup" / name).write_text('{"epo')
    with pytest.raises(ConfigError, match=r"training_metadata.json: the backup is unreadable .* delete .*backup"):
        read_state(tmp_path / "backup")


@pytest.mark.unit
def test_the_backup_keeps_only_the_weights_its_two_metadata_files_name(tmp_path):
    backup = RunBackup(tmp_path / "backup")
    backup.set_model(_backup_model())
    for epoch in range(1, 5):
        backup.save(epoch)
    weights = sorted(path.name for path in (tmp_path / "backup").glob("*.weights.h5"))
    assert [name[:10] for name in weights] == ["epoch00003", "epoch00004"]


def _fitted_pair(augment: bool) -> tuple[keras.Model, keras.Model]:
    """(model being fitted, inference model of its layers) after one Adam step: the same model, or a training
    model with a flip in front of the inference model's layers."""
    inputs = keras.Input((4, 4, 3))
    network = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    inference = keras.Model(inputs, network(inputs))
    training = keras.Model(inputs, network(keras.layers.RandomFlip(seed=1)(inputs))) if augment else inference
    training.compile(optimizer="adam", loss="mse")
    training.fit(np.ones((4, 4, 4, 3)), np.ones((4, 2)), verbose=0)
    return training, inference


@pytest.mark.unit
@pytest.mark.parametrize("augment", [False, True], ids=["one-model", "training-model-apart"])
def test_an_epoch_end_backup_links_the_checkpoint_and_restores_weights_and_optimizer(tmp_path, augment):
    from trainer.runs import checkpoints

    training, inference = _fitted_pair(augment)
    last = tmp_path / "checkpoints" / "last.keras"
    last.parent.mkdir()
    info = checkpoints.ModelInfo(("a", "b"), 4, 4, "none")
    backup = RunBackup(tmp_path / "backup", checkpoint=last, inference=inference)
    backup.set_model(training)
    for epoch in (1, 2, 3):
        training.optimizer.iterations.assign(epoch * 10)
        training.layers[-1].set_weights([weight + epoch for weight in training.layers[-1].get_weights()])
        checkpoints.save(inference, last, dataclasses.replace(info, epoch=epoch))
        backup.on_epoch_end(epoch - 1)
    files = sorted(path.name for path in (tmp_path / "backup").iterdir())
    assert not [name for name in files if name.endswith(".weights.h5")], "no second save of the weights"
    state = read_state(tmp_path / "backup")
    assert state.epoch == 3 and state.weights.suffix == ".keras"
    assert os.path.samefile(state.weights, last), "a hard link: no bytes written twice"
    assert state.state is not None, "the optimizer state beside the checkpoint, which holds the model only"
    assert len([name for name in files if name.startswith("epoch00003")]) == 2
    assert not [name for name in files if name.startswith("epoch00001")], "only the two committed epochs stay"
    expected = [np.asarray(variable) for variable in [*training.variables, *training.optimizer.variables]]

    fresh_training, fresh_inference = _fitted_pair(augment)
    fresh_training.fit(np.ones((4, 4, 4, 3)), np.ones((4, 2)), verbose=0)  # the flip's seed state moves on too
    fresh_training.optimizer.iterations.assign(0)
    restore(fresh_training, tmp_path / "backup", fresh_inference)
    restored = [np.asarray(variable) for variable in [*fresh_training.variables, *fresh_training.optimizer.variables]]
    assert int(fresh_training.optimizer.iterations) == 30
    for want, got in zip(expected, restored, strict=True):
        np.testing.assert_array_equal(want, got)


@pytest.mark.unit
def test_an_epoch_end_backup_saves_the_weights_itself_where_the_checkpoint_is_not_this_epochs(tmp_path):
    from trainer.runs import checkpoints

    training, inference = _fitted_pair(False)
    last = tmp_path / "last.keras"
    checkpoints.save(inference, last, checkpoints.ModelInfo(("a", "b"), 4, 4, "none", epoch=1))  # a diverged epoch 2
    backup = RunBackup(tmp_path / "backup", checkpoint=last, inference=inference)
    backup.set_model(training)
    backup.on_epoch_end(1)
    state = read_state(tmp_path / "backup")
    assert state.epoch == 2 and state.weights.name.endswith(".weights.h5") and state.state is None


# --- files the team can read ---------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_json(tmp_path / "metrics.json", {"a": 1})
        write_atomic(tmp_path / "last.keras", _backup_model().save)
    finally:
        os.umask(previous)
    assert {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()} == {
        "metrics.json": mode,
        "last.keras": mode,
    }
