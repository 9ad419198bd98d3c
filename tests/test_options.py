"""Speed options run on CPU and give sane results: precision, XLA, steps per execution, the decoded cache."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from conftest import check_run_metrics, compose
from trainer.tasks import run_task


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.precision=mixed_bfloat16"],
        ["trainer.precision=mixed_float16"],
        ["trainer.jit_compile=true"],
        ["trainer.steps_per_execution=2"],
        ["dataset.cache=false"],
    ],
    ids=lambda overrides: overrides[0],
)
def test_option_trains_to_finite_metrics(tmp_path, overrides, caplog):
    caplog.set_level("INFO", logger="trainer.tasks.train")
    try:
        objective = run_task(compose(["debug=smoke", "trainer.epochs=2", *overrides], tmp_path))
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
        model = keras.saving.load_model(tmp_path / "checkpoints" / "best.keras")
        assert model.get_layer("vgg19").get_layer("block1_conv1").dtype_policy.name == overrides[0].split("=")[1]
        assert model.output.dtype == "float32", "softmax stays in float32"
