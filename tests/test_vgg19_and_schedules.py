"""VGG19's structure and argument checks; learning-rate schedules."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

from trainer.config.groups import ScheduleConfig
from trainer.models.vgg19 import build_vgg19
from trainer.training.optimizers import build_learning_rate, build_optimizer, peak_learning_rate

pytestmark = pytest.mark.unit

CONV_NAMES = [f"block{b}_conv{c}" for b, n in enumerate((2, 2, 4, 4, 4), 1) for c in range(1, n + 1)]


def test_layers_are_named_and_shaped_like_keras_vgg19():
    ours = build_vgg19(10, (32, 32, 3), dropout=0.0, weight_decay=0.0, batch_norm=False)  # Keras's: no batch norm
    reference = keras.applications.VGG19(weights=None, include_top=False, input_shape=(32, 32, 3))
    for name in [*CONV_NAMES, *(f"block{b}_pool" for b in range(1, 6))]:
        assert ours.get_layer(name).output.shape == reference.get_layer(name).output.shape, name
    conv_params = sum(ours.get_layer(name).count_params() for name in CONV_NAMES)
    assert conv_params == reference.count_params() == 20_024_384
    assert [layer.name for layer in ours.layers[-6:]][-1] == "predictions"
    assert {"fc1", "fc2"} <= {layer.name for layer in ours.layers}


@pytest.mark.parametrize("size", [28, 32, 224])
def test_head_suits_small_and_imagenet_inputs(size):
    model = build_vgg19(3, (size, size, 3), width_multiplier=0.125, fc_units=16)
    probabilities = model(np.zeros((2, size, size, 3), np.float32), training=False)
    assert probabilities.shape == (2, 3)
    np.testing.assert_allclose(np.sum(probabilities, axis=1), 1.0, rtol=1e-5)


def test_batch_norm_dropout_and_weight_decay_are_where_asked():
    model = build_vgg19(10, (32, 32, 3), width_multiplier=0.125, dropout=0.3, weight_decay=1e-3, batch_norm=True)
    names = {layer.name for layer in model.layers}
    assert {"block1_conv1_bn", "fc1_dropout", "fc2_dropout"} <= names
    assert model.get_layer("fc1_dropout").rate == 0.3
    assert model.get_layer("block3_conv4").kernel_regularizer.l2 == pytest.approx(1e-3)
    assert len(model.losses) == 16 + 3  # one L2 term per conv and dense kernel


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_dropout_keeps_activations_unbiased_in_every_precision(policy):
    """Inverted dropout keeps the mean: in bfloat16 TensorFlow's dropout kept 69.5% of the units at rate 0.3 and
    scaled them by 1.4297 (a mean of 0.993), unlike inference (issue 52's mixed_bfloat16 demo)."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = build_vgg19(10, (32, 32, 3), width_multiplier=0.125, fc_units=16, dropout=0.3)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.get_layer("fc1").compute_dtype == policy.removeprefix("mixed_")  # the layers around stay half
    units = keras.ops.ones((1000, 1000), dtype=model.get_layer("fc1").compute_dtype)  # fc1's output, 10^6 units
    for name in ("fc1_dropout", "fc2_dropout"):
        dropped = keras.ops.convert_to_numpy(model.get_layer(name)(units, training=True)).astype(np.float64)
        assert np.mean(dropped != 0) == pytest.approx(0.7, abs=0.003), name  # 6 standard deviations
        assert np.mean(dropped) == pytest.approx(1.0, abs=0.004), name


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dropout": 1.0}, "dropout=1.0"),
        ({"width_multiplier": 0}, "width_multiplier=0"),
        ({"weight_decay": -1.0}, "weight_decay=-1.0"),
        ({"input_shape": (8, 8, 3)}, "input_shape=(8, 8, 3)"),
        ({"num_classes": 1}, "num_classes=1"),
    ],
)
def test_bad_arguments_repeat_the_value(kwargs, message):
    arguments = {"num_classes": 10, **kwargs}
    with pytest.raises(ValueError, match=f"Received: {message}".replace("(", r"\(").replace(")", r"\)")):
        build_vgg19(**arguments)


def _lr(schedule, step):
    return float(schedule(step)) if callable(schedule) else schedule


def _target(name: str) -> str:
    """The builder `optimizer.schedule.name=NAME` names."""
    return ScheduleConfig(name=name).target


def test_step_decay_multiplies_at_each_boundary():
    schedule = build_learning_rate(_target("step"), 0.1, steps_per_epoch=10, epochs=30, boundaries=[10, 20], factor=0.1)
    assert [_lr(schedule, s) for s in (0, 99, 101, 199, 201)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])


def test_cosine_warms_up_then_decays_to_alpha():
    schedule = build_learning_rate(_target("cosine"), 0.1, steps_per_epoch=10, epochs=10, warmup_epochs=2, alpha=0.1)
    assert _lr(schedule, 0) == pytest.approx(0.0)
    assert _lr(schedule, 10) == pytest.approx(0.05)
    assert _lr(schedule, 20) == pytest.approx(0.1)
    assert _lr(schedule, 100) == pytest.approx(0.01)
    assert build_learning_rate(_target("constant"), 0.3, 10, 10) == 0.3


def test_a_warmup_longer_than_the_run_is_cut_so_the_run_reaches_its_peak_rate():
    """experiment=cifar_vgg19_modern warms up for 5 epochs; a 4-epoch trial of it never reached its peak."""
    schedule = build_learning_rate(_target("cosine"), 0.1, steps_per_epoch=10, epochs=4, warmup_epochs=5, alpha=0.0)
    rates = [_lr(schedule, step) for step in range(40)]
    assert max(rates) == pytest.approx(0.1) and rates.index(max(rates)) == 4, "a tenth of the run: 4 steps"


def test_unknown_names_are_one_clear_error():
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"optimizer._target_=keras.optimizers.Lamb2 \(keys \[\]\)"):
        build_optimizer("keras.optimizers.Lamb2", 0.1, {})
    with pytest.raises(ConfigError, match=r"optimizer._target_=keras.optimizers.Adam \(keys \['momentum'\]\)"):
        build_optimizer("keras.optimizers.Adam", 0.1, {"momentum": 0.9})  # Adam takes no momentum
    with pytest.raises(ConfigError, match=r"^optimizer.schedule._target_=trainer.training.optimizers.linear"):
        build_learning_rate(_target("linear"), 0.1, 10, 10)  # the config refuses the name first (test_configs)


def test_optimizers_get_their_settings():
    sgd = build_optimizer("keras.optimizers.SGD", 0.1, {"momentum": 0.8, "nesterov": True, "clipnorm": 1.0})
    assert (sgd.momentum, sgd.nesterov, sgd.clipnorm) == (0.8, True, 1.0)
    assert build_optimizer("keras.optimizers.AdamW", 0.1, {"weight_decay": 0.05}).weight_decay == 0.05


@pytest.mark.parametrize("option, kind", [("sgd", "SGD"), ("adam", "Adam"), ("adamw", "AdamW")])
def test_every_optimizer_option_builds_its_keras_class_with_its_own_keys(option, kind):
    from conftest import compose
    from trainer.config import to_settings

    settings = to_settings(compose([f"optimizer={option}", "optimizer.clipnorm=2.0"]))
    optimizer = build_optimizer(settings.optimizer._target_, 0.01, settings.optimizer.keras_options())
    assert type(optimizer).__name__ == kind and optimizer.clipnorm == 2.0


def test_peak_learning_rate_follows_the_linear_scaling_rule():
    assert peak_learning_rate(0.1, batch_size=32, lr_batch_size=128) == pytest.approx(0.025)
    assert peak_learning_rate(0.1, batch_size=256, lr_batch_size=128, replicas=2) == pytest.approx(0.2)
    assert peak_learning_rate(0.1, batch_size=32) == 0.1
    assert peak_learning_rate(0.1, batch_size=32, replicas=4, scale_with_replicas=True) == pytest.approx(0.4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optimizer.lr_batch_size=0"], "optimizer.lr_batch_size must be >= 1 or null; got 0"),
        (
            ["optimizer.lr_batch_size=128", "optimizer.scale_with_replicas=true"],
            "optimizer.lr_batch_size must be null when optimizer.scale_with_replicas=true",
        ),
    ],
)
def test_lr_batch_size_is_checked_at_start_up(overrides, message):
    from conftest import compose
    from trainer.config import to_settings
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        to_settings(compose(overrides))
