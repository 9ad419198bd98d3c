"""The multi-worker `fit` workaround: patched only on verified Keras versions, and told when upstream fixes it."""

from __future__ import annotations

import keras
import pytest

from trainer.distribute import compat
from trainer.errors import ConfigError

pytestmark = pytest.mark.unit


def test_upstream_keras_still_has_both_multi_worker_bugs():
    """When this fails, Keras fixed keras#20585 / tensorflow#72388: delete trainer/distribute/compat.py and its call."""
    assert compat.upstream_bugs() == ["build", "scalar_axis"], (
        f"Keras {keras.__version__} fixed the multi-worker fit bugs; trainer/distribute/compat.py can go"
    )


def test_unverified_keras_versions_are_not_patched(monkeypatch):
    monkeypatch.setattr(compat, "_applied", False)
    monkeypatch.setattr(compat, "VERIFIED", ("0.0.0",))
    with pytest.raises(ConfigError, match=r"verified only on Keras 0\.0\.0"):
        compat.apply()
    monkeypatch.setattr(compat, "upstream_bugs", lambda: [])  # a release that fixed both
    assert compat.apply() is False
    assert not compat._applied


def test_the_verified_version_is_patched_and_the_probe_still_sees_the_original(monkeypatch):
    from keras.src.backend.tensorflow import trainer as tf_trainer

    monkeypatch.setattr(compat, "VERIFIED", (keras.__version__,))
    monkeypatch.setattr(compat, "_applied", False)
    monkeypatch.setattr(
        tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    )
    monkeypatch.setattr(tf_trainer, "reduce_per_replica", tf_trainer.reduce_per_replica)
    monkeypatch.setattr(compat, "_originals", {})
    assert compat.apply() is True
    assert tf_trainer.reduce_per_replica is not compat._originals["reduce"]
    assert compat.upstream_bugs() == ["build", "scalar_axis"]
