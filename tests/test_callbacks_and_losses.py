"""callbacks= (early stopping, LR on plateau), trainer.label_smoothing and trainer.class_weight."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from conftest import cifar_overrides, compose, history_epochs, tiny_overrides
from trainer.config import to_settings
from trainer.errors import ConfigError
from trainer.tasks.data import load_data
from trainer.tasks.parts import build_callbacks
from trainer.tasks.train import train
from trainer.tasks.weights import class_weight
from trainer.training.losses import build_loss, class_weights


@pytest.mark.integration
def test_early_stopping_stops_on_a_plateau_and_metrics_json_says_so(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    overrides = [
        *tiny_overrides(cifar_dir),  # the three-layer test model: the callback is the point
        "trainer.epochs=6",
        "optimizer.lr=1e-9",  # the weights barely move: val_accuracy stays flat
        "optimizer.schedule.name=constant",
        "callbacks=early_stopping",
        "callbacks.early_stopping.patience=1",
    ]
    train(to_settings(compose(overrides, run_dir)))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["stopped_early"] is True
    assert metrics["epochs_completed"] == 2 < 6  # epoch 2 did not improve on epoch 1: stop
    assert history_epochs(run_dir) == [1, 2]


def _one_batch_loss(loss, weights: dict[int, float] | None, images, labels) -> tuple[float, np.ndarray]:
    """fit's reported loss for one batch at learning rate 0, and the model's probabilities for that batch."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    probabilities = model.predict(images, verbose=0)
    history = model.fit(images, labels, batch_size=len(labels), epochs=1, verbose=0, class_weight=weights)
    return history.history["loss"][0], probabilities


IMAGES = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
LABELS = np.array([0, 0, 0, 1, 2, 2])


@pytest.mark.unit
def test_class_weights_change_the_loss_as_computed_by_hand():
    weights = class_weights({1: 4.0, 2: 0.5}, None, 3)
    assert weights == {0: 1.0, 1: 4.0, 2: 0.5}
    plain, probabilities = _one_batch_loss(build_loss(0.0), None, IMAGES, LABELS)
    weighted, _ = _one_batch_loss(build_loss(0.0), weights, IMAGES, LABELS)
    cross_entropy = -np.log(probabilities[np.arange(len(LABELS)), LABELS])
    per_example = np.array([weights[label] for label in LABELS])
    assert plain == pytest.approx(cross_entropy.mean(), rel=1e-5)
    assert weighted == pytest.approx((per_example * cross_entropy).mean(), rel=1e-5)  # Keras: sum / batch size
    assert weighted != pytest.approx(plain, rel=1e-3)


@pytest.mark.unit
def test_label_smoothing_matches_the_formula():
    smoothing = 0.2
    loss, probabilities = _one_batch_loss(build_loss(smoothing), None, IMAGES, LABELS)
    targets = np.full((len(LABELS), 3), smoothing / 3)
    targets[np.arange(len(LABELS)), LABELS] += 1 - smoothing
    assert loss == pytest.approx(-(targets * np.log(probabilities)).sum(axis=1).mean(), rel=1e-5)


@pytest.mark.integration
def test_balanced_weights_come_from_the_training_split_counts(cifar_dir):
    settings = to_settings(compose([*cifar_overrides(cifar_dir), "trainer.class_weight=balanced"]))
    data = load_data(settings.dataset, 8, 0)
    labels = np.concatenate([batch_labels.numpy() for _, batch_labels in data.split("train")])
    counts = np.bincount(labels, minlength=10)
    weights = class_weight(settings, data)
    for index, count in enumerate(counts):
        expected = len(labels) / (10 * count) if count else 1.0
        assert weights[index] == pytest.approx(expected)
    assert class_weights("balanced", [30, 10], 2) == {0: pytest.approx(40 / 60), 1: pytest.approx(40 / 20)}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.class_weight=sometimes"], "trainer.class_weight must be null, balanced or a mapping"),
        (["trainer.class_weight={0: -1.0}"], "trainer.class_weight must be"),
        (["trainer.class_weight={a: 1.0}"], "trainer.class_weight must be"),
        (
            ["trainer.class_weight={0: inf}"],
            "trainer.class_weight must be null, balanced or a mapping {class index: "
            "finite weight > 0}, e.g. {0: 1.0, 1: 3.0}; got {0: inf}",
        ),  # it was blamed on optimizer.lr after a step
        (["trainer.class_weight={1: 1e39}"], "trainer.class_weight must be"),  # inf as a float32
        (["trainer.label_smoothing=1.0"], "trainer.label_smoothing must be in [0, 1)"),
        (["callbacks=early_stopping", "callbacks.early_stopping.patience=-1"], "patience must be >= 0"),
        (["callbacks=reduce_lr_on_plateau", "callbacks.reduce_lr_on_plateau.factor=2"], "factor must be in (0, 1)"),
    ],
)
def test_bad_loss_and_callback_values_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError) as caught:
        to_settings(compose(overrides))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.unit
def test_a_class_outside_the_dataset_and_a_plateau_rule_fighting_a_schedule_are_refused():
    with pytest.raises(ConfigError, match="class 12 is outside the dataset's 10 classes"):
        class_weights({12: 2.0}, None, 10)
    settings = to_settings(compose(["callbacks=reduce_lr_on_plateau", "optimizer.schedule.name=cosine"]))
    with pytest.raises(ConfigError, match="needs optimizer.schedule.name=constant"):
        build_callbacks(settings.callbacks, settings.optimizer.schedule)
