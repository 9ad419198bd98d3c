"""The model owns its preprocessing: uint8 in, built-in Keras layers for the cast, colour jitter and normalization,
and a `.keras` file that carries its class names and input spec."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.data.augmentation import Augmentation
from trainer.errors import DataError
from trainer.models.preprocessing import augmentation_layers, build_models, normalization_layer
from trainer.runs import checkpoints

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (16, 24, 24, 3)).astype(np.uint8)


JITTER = Augmentation(flip=True, brightness=40.0, contrast_lower=0.5, contrast_upper=1.5)


def _tiny_network(size: int = 24, classes: int = 3) -> keras.Model:
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax", name="predictions")(x), name="tiny")


@pytest.mark.unit
def test_standardize_layer_matches_per_image_standardization():
    ours = normalization_layer("standardize")(IMAGES.astype(np.float32))
    expected = tf.image.per_image_standardization(IMAGES.astype(np.float32))
    np.testing.assert_allclose(np.asarray(ours), expected.numpy(), atol=1e-5)


@pytest.mark.unit
def test_caffe_layer_matches_keras_preprocess_input():
    ours = normalization_layer("caffe")(IMAGES.astype(np.float32))
    expected = keras.applications.vgg19.preprocess_input(IMAGES.astype(np.float32))
    np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)


@pytest.mark.unit
def test_color_jitter_draws_one_factor_per_image_and_is_off_at_evaluation():
    count = 1024
    noise = np.clip(RNG.normal(128, 20, (count, 8, 8, 3)), 0, 255).astype(np.float32)
    (contrast,) = augmentation_layers(Augmentation(contrast_lower=0.5, contrast_upper=1.5), seed=3)
    factors = (np.std(np.asarray(contrast(noise, training=True)), axis=(1, 2)) / np.std(noise, axis=(1, 2)))[:, 0]
    assert 0.5 - 0.02 <= factors.min() and factors.max() <= 1.5 + 0.02
    assert abs(factors.mean() - 1.0) < 0.05 and abs(factors.std() - 1 / np.sqrt(12)) < 0.03  # uniform(0.5, 1.5)
    (brightness,) = augmentation_layers(Augmentation(brightness=40.0), seed=3)
    gray = np.full((count, 2, 2, 3), 128.0, np.float32)
    deltas = np.asarray(brightness(gray, training=True))[:, 0, 0, 0] - 128.0
    assert deltas.min() >= -40.01 and deltas.max() <= 40.01 and abs(deltas.std() - 40 / np.sqrt(3)) < 2.5
    for layer in (contrast, brightness):
        np.testing.assert_array_equal(np.asarray(layer(noise, training=False)), noise)


@pytest.mark.unit
def test_the_flip_mirrors_about_half_the_images_each_whole_and_is_off_at_evaluation():
    grid = np.arange(16, dtype=np.float32)[None, None, :, None] * np.ones((512, 4, 1, 3), np.float32)
    (flip,) = augmentation_layers(Augmentation(flip=True), seed=5)
    flipped = np.asarray(flip(grid, training=True))
    mirrored = flipped[:, 0, 0, 0] == 15
    np.testing.assert_array_equal(flipped[mirrored], grid[mirrored][:, :, ::-1])  # whole images, left-right
    np.testing.assert_array_equal(flipped[~mirrored], grid[~mirrored])
    assert 0.4 < mirrored.mean() < 0.6, "one draw per image, not per batch"
    np.testing.assert_array_equal(np.asarray(flip(grid, training=False)), grid)


@pytest.mark.unit
def test_the_inference_model_takes_uint8_and_only_the_training_model_augments():
    models = build_models(_tiny_network(), "standardize", JITTER, seed=1)
    inference, training = models.inference, models.training
    assert inference.input.dtype == "uint8" and inference.input_shape == (None, 24, 24, 3)
    assert not [layer.name for layer in inference.layers if layer.name.startswith("random_")]
    assert [layer.name for layer in training.layers if layer.name.startswith("random_")] == [
        "random_flip",
        "random_brightness",
        "random_contrast",
    ]
    assert {id(weight) for weight in inference.weights} == {id(weight) for weight in training.weights}, "shared"
    first = inference.predict(IMAGES, verbose=0)
    np.testing.assert_array_equal(first, training.predict(IMAGES, verbose=0))  # predict: training=False
    network_only = inference.get_layer("tiny").predict(tf.image.per_image_standardization(IMAGES / 1), verbose=0)
    np.testing.assert_allclose(first, network_only, atol=1e-5)
    assert not np.allclose(training(IMAGES, training=True), first, atol=1e-4), "jitter must act in training"
    plain = build_models(_tiny_network(), "standardize", Augmentation(), seed=1)
    assert plain.training is plain.inference, "nothing to add: one model"


def _moving_statistics(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(weight) for weight in model.get_layer("tiny").get_layer("bn").non_trainable_weights]


@pytest.mark.unit
def test_a_loaded_checkpoint_called_bare_agrees_with_predict_and_changes_no_statistic(tmp_path):
    models = build_models(_tiny_network(), "standardize", JITTER, seed=1)
    path = tmp_path / "model.keras"
    checkpoints.save(models.inference, path, checkpoints.ModelInfo(("a", "b", "c"), 24, 24, "standardize"))
    loaded, _ = checkpoints.load(path)
    before, predicted = _moving_statistics(loaded), loaded.predict(IMAGES, verbose=0)
    bare = np.asarray(loaded(IMAGES))  # Grad-CAM recipes and GradientTape loops call the model like this
    for old, new in zip(before, _moving_statistics(loaded), strict=True):
        np.testing.assert_array_equal(old, new)
    np.testing.assert_allclose(bare, predicted, atol=1e-6)
    np.testing.assert_allclose(np.asarray(loaded(IMAGES, training=False)), predicted, atol=1e-6)
    np.testing.assert_array_equal(loaded.predict(IMAGES, verbose=0), predicted)


@pytest.mark.unit
def test_a_checkpoint_of_an_earlier_version_loads_without_its_random_layers(tmp_path, caplog):
    network = _tiny_network()
    image = keras.Input((24, 24, 3), dtype="uint8", name="image")
    x = keras.layers.Rescaling(1.0, dtype="float32", name="to_float")(image)
    for layer in [*augmentation_layers(JITTER, seed=1), normalization_layer("standardize")]:
        x = layer(x)
    old = keras.Model(image, network(x), name="tiny")  # what vggtrain saved before the training wrapper
    path = tmp_path / "old.keras"
    checkpoints.save(old, path, checkpoints.ModelInfo(("a", "b", "c"), 24, 24, "standardize"))
    with caplog.at_level("INFO"):
        loaded, _ = checkpoints.load(path)
    assert "old.keras holds training-only augmentation layers" in caplog.text
    assert not [layer.name for layer in loaded.layers if layer.name.startswith("random_")]
    np.testing.assert_allclose(loaded.predict(IMAGES, verbose=0), old.predict(IMAGES, verbose=0), atol=1e-6)
    before = _moving_statistics(loaded)
    loaded(IMAGES)
    for old_value, new in zip(before, _moving_statistics(loaded), strict=True):
        np.testing.assert_array_equal(old_value, new)


@pytest.mark.e2e
def test_a_checkpoint_carries_its_class_names_and_loads_without_project_code(tmp_path):
    model = build_models(_tiny_network(), "caffe").inference
    info = checkpoints.ModelInfo(("cat", "dog", "bird"), 24, 28, "caffe", "pets")
    path = tmp_path / "model.keras"
    checkpoints.save(model, path, info)
    loaded, loaded_info = checkpoints.load(path)
    assert loaded_info == info
    np.testing.assert_allclose(loaded.predict(IMAGES, verbose=0), model.predict(IMAGES, verbose=0), atol=1e-6)
    np.save(tmp_path / "images.npy", IMAGES)
    script = (
        "import sys, numpy as np, keras\n"
        "assert not any(name.startswith('trainer') for name in sys.modules)\n"
        f"model = keras.saving.load_model({str(path)!r}, safe_mode=True)\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, model.predict(np.load({str(tmp_path / 'images.npy')!r}), verbose=0))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), model.predict(IMAGES, verbose=0), atol=1e-6)


@pytest.mark.unit
def test_an_old_float_input_checkpoint_is_one_error(tmp_path):
    old = tmp_path / "old.keras"
    _tiny_network().save(old)
    with pytest.raises(DataError, match=r"old\.keras was saved by an older vggtrain .* train it again") as error:
        checkpoints.load(old)
    assert "\n" not in str(error.value)


@pytest.mark.unit
def test_the_info_entry_is_checked_against_the_model(tmp_path):
    path = tmp_path / "model.keras"
    checkpoints.save(build_models(_tiny_network()).inference, path, checkpoints.ModelInfo(("a", "b"), 24, 24, "none"))
    with pytest.raises(DataError, match="predicts 3 classes but names 2"):
        checkpoints.load(path)
    assert checkpoints.INFO_ENTRY in zipfile.ZipFile(path).namelist()


@pytest.mark.unit
def test_data_with_other_class_names_is_one_error_naming_both_lists():
    info = checkpoints.ModelInfo(("cat", "dog"), 24, 24, "standardize")
    with pytest.raises(DataError, match=r"trained on classes \['cat', 'dog'\] but the dataset has \['dog', 'cat'\]"):
        checkpoints.check_data("m.keras", info, ["dog", "cat"], 24, "the dataset")
    with pytest.raises(DataError, match="takes 24x24 images but the dataset gives 28x28"):
        checkpoints.check_data("m.keras", info, ["cat", "dog"], 28, "the dataset")


@pytest.mark.unit
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("resize_to", 0, "has resize_to=0; expected a whole number from image_size 24 to 96"),
        ("resize_to", 100000, "has resize_to=100000; expected a whole number from image_size 24 to 96"),
        ("epoch", 10**12, "has epoch=1000000000000; expected a whole number from 0 to 1000000"),
        ("format_version", 99, "has format_version=99; expected 1 to 1 (a newer vggtrain saved it?)"),
        ("resize_mode", "stretch", "has resize_mode='stretch'; expected resize, crop or pad"),
        ("normalization", "imagenet", "has normalization='imagenet'; expected standardize, caffe or none"),
        ("image_size", 64, "has image_size=64; expected 24, the side of the model's input"),
        ("image_size", "x", "has image_size='x'; expected 24"),
        ("class_names", ["a", "a", "b"], "has class_names=['a', 'a', 'b']; expected distinct non-empty class names"),
        ("class_names", None, "has no field 'class_names'"),
    ],
)
def test_wrong_stored_metadata_is_one_line_naming_the_checkpoint_and_the_field(tmp_path, field, value, message):
    path = tmp_path / "model.keras"
    model = build_models(_tiny_network()).inference
    model.save(path)
    fields = {"class_names": ["a", "b", "c"], "image_size": 24, "resize_to": 24, "normalization": "standardize"}
    fields[field] = value
    if value is None:
        del fields[field]
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(checkpoints.INFO_ENTRY, json.dumps(fields))
    with pytest.raises(DataError, match=re.escape(f"checkpoint={path}: vggtrain.json {message}")) as error:
        checkpoints.load(path)
    assert "\n" not in str(error.value)


@pytest.mark.unit
def test_a_checkpoint_of_a_compiled_model_holds_the_model_only(tmp_path):
    """best.keras and last.keras are what users deploy: no optimizer slots (Adam's made them 3x the model) and no
    compile settings; the run's backup keeps what a resume needs."""
    import h5py

    model = build_models(_tiny_network()).inference
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    images = np.random.default_rng(0).integers(0, 256, (8, 24, 24, 3)).astype(np.uint8)
    model.fit(images, np.zeros(8, np.int32), epochs=1, verbose=0)  # Adam's slots exist and are non-zero
    path = tmp_path / "best.keras"
    checkpoints.save(model, path, checkpoints.ModelInfo(("a", "b", "c"), 24, 24, "standardize"))
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        archive.extract("model.weights.h5", tmp_path)
    assert not config.get("compile_config"), "no compile settings"
    with h5py.File(tmp_path / "model.weights.h5") as weights:
        assert "optimizer" not in weights, "no optimizer variables"
    loaded, _ = checkpoints.load(path)
    np.testing.assert_array_equal(loaded.predict(images, verbose=0), model.predict(images, verbose=0))
