"""objective.tolerance: which epoch best.keras holds when a small validation split ranks epochs by noise."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compose
from trainer.config import to_settings
from trainer.errors import ConfigError
from trainer.runs.history import best_index, improves

pytestmark = pytest.mark.unit


def _streamed(values: list[float], mode: str, tolerance: float) -> int:
    """The epoch the Checkpoints callback ends on: each epoch that `improves` on the best value seen takes over."""
    chosen, peak = 0, values[0]
    for index, value in enumerate(values[1:], start=1):
        if improves(value, peak, mode, tolerance):
            chosen = index
            peak = value if improves(value, peak, mode) else peak
    return chosen


def test_without_tolerance_the_first_best_epoch_wins_as_before():
    assert best_index([0.9, 0.99, 0.98, 0.99], "max") == 1
    assert best_index([0.5, 0.2, 0.2, 0.3], "min") == 1


def test_with_tolerance_the_last_epoch_within_it_of_the_best_wins():
    seed_11 = [0.115, 0.19, 0.78, 0.915, 0.98, 0.99, 0.98, 0.99, 0.985, 0.975, 0.985, 0.99]  # the demo's val_accuracy
    assert best_index(seed_11, "max") == 5, "epoch 6: 98.6% on test"
    assert best_index(seed_11, "max", 0.01) == 11, "epoch 12: 100% on test"
    assert best_index([0.5, 0.3, 0.305, 0.4], "min", 0.01) == 2
    assert best_index([0.9, 0.99, 0.97], "max", 0.01) == 1, "an epoch further than the tolerance never wins"


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_callbacks_choice_and_the_historys_agree_on_any_sequence(mode):
    rng = np.random.default_rng(0)
    for _ in range(500):
        values = [round(float(value), 3) for value in rng.uniform(0, 1, rng.integers(1, 15))]
        tolerance = float(rng.choice([0.0, 0.01, 0.05, 0.2]))
        assert _streamed(values, mode, tolerance) == best_index(values, mode, tolerance), (values, tolerance)


def test_a_negative_tolerance_is_one_line():
    with pytest.raises(ConfigError, match=r"^objective.tolerance must be >= 0; got -0.1"):
        to_settings(compose(["objective.tolerance=-0.1"]))
    assert to_settings(compose([])).objective.tolerance == 0.01, "the digits demo's preset"
    assert to_settings(compose(["dataset=cifar"])).objective.tolerance == 0.0
