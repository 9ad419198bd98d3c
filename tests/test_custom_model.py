"""model=custom: any function returning a keras.Model, found by `_target_`, trains like the built-in VGG19."""

from __future__ import annotations

import json
import re

import keras
import pytest

from conftest import cifar_overrides, compose
from trainer.config import to_settings
from trainer.errors import ConfigError, DataError
from trainer.models.registry import build_model
from trainer.tasks.train import train

TARGET = "test_custom_model.build_tiny"


def build_tiny(num_classes: int, input_shape: tuple[int, int, int], units: int = 16) -> keras.Model:
    """Three layers: a conv, a dense hidden layer and the classifier."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(4, 3, strides=2, activation="relu", name="tiny_conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(units, activation="relu", name="tiny_hidden")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="tiny")


def build_wrong_outputs(num_classes: int, input_shape: tuple[int, int, int]) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes + 1)(keras.layers.Flatten()(inputs)))


def build_two_outputs(num_classes: int, input_shape: tuple[int, int, int]) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    features = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, [keras.layers.Dense(num_classes)(features), keras.layers.Dense(1)(features)])


def build_spatial_output(num_classes: int, input_shape: tuple[int, int, int]) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    return keras.Model(inputs, keras.layers.Conv2D(num_classes, 1)(inputs))  # (batch, h, w, classes)


def build_missing_weights(num_classes: int, input_shape: tuple[int, int, int]) -> keras.Model:
    raise DataError("model.weights=/nowhere.h5: no such file")


def _custom(cifar_dir, *extra):
    # Not debug=smoke: it sets VGG19 keys (width_multiplier, fc_units) the custom builder does not take.
    overrides = [item for item in cifar_overrides(cifar_dir) if item != "debug=smoke"]
    return [*overrides, "trainer.epochs=1", "trainer.verbose=0", "model=custom", *extra]


@pytest.mark.integration
def test_a_custom_three_layer_model_trains_with_its_own_keys(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    overrides = _custom(cifar_dir, f"model._target_={TARGET}", "model.units=5", "logger=csv")
    settings = to_settings(compose(overrides, run_dir))
    train(settings)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 1 and 0 <= metrics["test_accuracy"] <= 1
    saved = keras.saving.load_model(run_dir / "checkpoints" / "best.keras", compile=False)
    assert saved.input.dtype == "uint8", "the model's own preprocessing layers wrap a custom network too"
    network = saved.get_layer("tiny")
    assert network.get_layer("tiny_hidden").units == 5  # model.units reached the builder
    assert network.get_layer("predictions").units == 10
    assert (run_dir / "history.csv").is_file() and not (run_dir / "tensorboard").exists()  # logger=csv


@pytest.mark.unit
def test_the_built_in_vgg19_goes_through_the_same_registry():
    settings = to_settings(compose(["debug=smoke"]))
    assert settings.model._target_ == "trainer.models.vgg19.build_vgg19"
    model = build_model(settings.model._target_, settings.model.builder_options(), 10, (32, 32, 3))
    assert model.get_layer("block1_conv1").filters == 8 and model.output_shape == (None, 10)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=custom"], "model._target_"),
        (["model=custom", "model._target_=no_such_module.build"], "model._target_=no_such_module.build"),
        (["model=custom", f"model._target_={TARGET}", "model.colour=red"], "colour"),
        (["model=custom", "model._target_=test_custom_model.build_wrong_outputs"], "11 outputs"),
        (
            ["model=custom", "model._target_=test_custom_model.build_two_outputs"],
            "outputs of shape (None, 10), (None, 1); expected one output of shape (batch, 10)",
        ),
        (
            ["model=custom", "model._target_=test_custom_model.build_spatial_output"],
            "outputs of shape (None, 32, 32, 10); expected one output of shape (batch, 10)",
        ),
        (["model=custom", f"model._target_={TARGET}", "model.preprocessing=sepia"], "model.preprocessing"),
    ],
)
def test_a_bad_custom_model_is_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        settings = to_settings(compose(overrides))
        build_model(settings.model._target_, settings.model.builder_options(), 10, (32, 32, 3))
    assert "\n" not in str(caught.value)


@pytest.mark.unit
def test_the_smallest_input_is_the_schemas_not_the_models_name():
    """A model of your own named vgg19 (the name the log and the curves show) took VGG19's limit of 16 pixels:
    the limit belongs to the built-in model's schema, whatever the name."""
    small = ["dataset.image_size=8", "model.width_multiplier=0.0625"]
    with pytest.raises(ConfigError, match=r"^dataset.image_size must be >= 16 for VGG19's five poolings"):
        to_settings(compose(small))
    mine = to_settings(compose(["model=custom", f"model._target_={TARGET}", "model.name=vgg19", small[0]]))
    assert (mine.model.name, mine.dataset.input_size) == ("vgg19", 8)
    with pytest.raises(ConfigError, match=r">= 32 for Keras's ImageNet VGG19 base"):
        to_settings(compose(["model=vgg19_imagenet", "dataset=cats_dogs", "dataset.image_size=16"]))
    assert build_model(TARGET, {}, 10, (8, 8, 3)).input_shape == (None, 8, 8, 3)


@pytest.mark.unit
def test_a_builder_s_own_clear_error_passes_through_unchanged():
    with pytest.raises(DataError, match=r"^model\.weights=/nowhere\.h5: no such file$"):
        build_model("test_custom_model.build_missing_weights", {}, 10, (32, 32, 3))


@pytest.mark.unit
def test_a_target_nested_in_a_section_is_refused_and_never_called(tmp_path):
    """A saved config is code: `resume=RUN` of someone else's folder must not open (create, truncate) files."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    evil = f"+model.evil={{_target_:builtins.open,_args_:[{victim},w]}}"
    settings = to_settings(compose(["model=custom", f"model._target_={TARGET}", evil]))
    with pytest.raises(ConfigError, match=r"^model\.evil\._target_: only model\._target_ is called") as caught:
        build_model(settings.model._target_, settings.model.builder_options(), 10, (32, 32, 3))
    assert victim.read_text() == "precious" and "\n" not in str(caught.value)
