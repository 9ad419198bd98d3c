"""Speed options run on CPU and give sane results: precision, XLA, steps per execution, the decoded cache."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_MODEL, check_run_metrics, compose
from trainer.tasks import run_task

pytestmark = pytest.mark.integration


# The precision options train VGG19 (its batch norm and float32 softmax under a mixed policy); the others, whose
# point is the training loop, the three-layer test model.
TINY = [*TINY_MODEL, "trainer.batch_size=16", "trainer.steps_per_epoch=4", "dataset.shuffle_buffer=256"]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["trainer.precision=mixed_bfloat16", "debug=smoke"], marks=pytest.mark.slow),  # as float16
        # Slow too (17 s): test_mixed_float16_checkpoint_and_backup_... trains float16 in the default suite, and
        # tests/test_precision_features.py every feature under both policies.
        pytest.param(["trainer.precision=mixed_float16", "debug=smoke"], marks=pytest.mark.slow),
        ["trainer.jit_compile=true", *TINY],
        ["trainer.steps_per_execution=2", *TINY],
        ["dataset.cache=false", *TINY],
    ],
    ids=lambda overrides: overrides[0],
)
def test_option_trains_to_finite_metrics(tmp_path, overrides, caplog):
    caplog.set_level("INFO", logger="trainer.tasks")
    try:
        objective = run_task(compose(["trainer.epochs=2", *overrides], tmp_path))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    metrics = check_run_metrics(tmp_path)
    assert objective == metrics["objective"]
    assert metrics["epochs_completed"] == 2
    if overrides[0] == "trainer.jit_compile=true":
        assert "XLA on <trainer.jit_compile=true>" in caplog.text
        if not tf.config.list_physical_devices("GPU"):
            assert "XLA without a GPU: on the CPU it makes VGG19 training 3-7x slower" in caplog.text
    if "precision" in overrides[0]:
        from trainer.runs.checkpoints import read_info

        best = tmp_path / "checkpoints" / "best.keras"
        model = keras.saving.load_model(best)  # the deliverable is float32 (tests/test_precision.py)
        assert model.get_layer("vgg19").get_layer("block1_conv1").dtype_policy.name == "float32"
        assert read_info(best).precision == overrides[0].split("=")[1], "vggtrain.json names what it trained in"
        assert model.output.dtype == "float32", "softmax stays in float32"


def _skipped_optimizer_loads(caught) -> list[str]:
    return [str(warning.message) for warning in caught if "Skipping variable loading" in str(warning.message)]


@pytest.mark.slow  # mixed float16 trains in the default suite (test_option_trains_to_finite_metrics)
def test_mixed_float16_checkpoint_and_backup_keep_their_optimizer_state_without_a_warning(tmp_path):
    """Keras wraps Adam in a LossScaleOptimizer at compile; a float32 process loading a checkpoint that held the
    optimizer rebuilt a bare Adam and dropped the saved state with "Skipping variable loading for optimizer
    'adam_N' (117 vs 121)". The checkpoint holds the model only now; the backup holds the optimizer state,
    and a resume restores it into the freshly compiled model."""
    from trainer.config import to_settings
    from trainer.runs.backup import RunBackup, restore
    from trainer.tasks.phases import compile_phase

    cfg = compose(["debug=smoke", "trainer.precision=mixed_float16"], tmp_path)  # 4 steps
    try:
        run_task(cfg)
        keras.mixed_precision.set_global_policy("float32")  # a new process: float32 until told otherwise
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = keras.saving.load_model(tmp_path / "checkpoints" / "last.keras")
        assert not _skipped_optimizer_loads(caught) and getattr(model, "optimizer", None) is None
        # Resume: the training task compiles a fresh model, then the backup restores the optimizer into it.
        keras.mixed_precision.set_global_policy("mixed_float16")
        trained = keras.saving.load_model(tmp_path / "checkpoints" / "last.keras", compile=False)
        compile_phase(trained, to_settings(cfg), 1e-3, steps_per_epoch=4, epochs=1)
        images = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3)).astype(np.uint8)
        trained.fit(images, np.arange(8) % 10, epochs=1, verbose=0)  # Adam's slots and the loss scale move
        assert isinstance(trained.optimizer, keras.optimizers.LossScaleOptimizer)
        saved = [np.asarray(variable) for variable in trained.optimizer.variables]
        assert len(saved) > 100  # VGG19's Adam slots, the loss scale's own
        # Steps from the initial scale 2**15 may overflow in float16 (each halves the scale and applies nothing).
        optimizer = trained.optimizer
        assert int(optimizer.iterations) > 0 or float(optimizer.dynamic_scale) != 2.0**15, "a trained state"
        backup = RunBackup(tmp_path / "backup")
        backup.set_model(trained)
        backup.save(1)
        fresh = keras.saving.load_model(tmp_path / "checkpoints" / "last.keras", compile=False)
        compile_phase(fresh, to_settings(cfg), 1e-3, steps_per_epoch=4, epochs=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restore(fresh, tmp_path / "backup")
        assert not _skipped_optimizer_loads(caught)
        for variable, value in zip(fresh.optimizer.variables, saved, strict=True):
            np.testing.assert_array_equal(np.asarray(variable), value)
    finally:
        keras.mixed_precision.set_global_policy("float32")
