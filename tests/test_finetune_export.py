"""Fine-tuning from VGG19 weights in a local file (no download), and the serving export round trip."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_cats_dogs import make_pets

from conftest import compose, csv_rows, run_cli
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.data.preprocess import to_model_size
from trainer.errors import DataError
from trainer.models.finetune import base_layers
from trainer.tasks import run_task

SIZE = 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Random VGG19 weights saved to a file, and tiny cats/dogs shards."""
    root = tmp_path_factory.mktemp("finetune")
    keras.utils.set_random_seed(0)
    base = keras.applications.VGG19(weights=None, include_top=False, input_shape=(SIZE, SIZE, 3))
    weights = root / "vgg19_notop.weights.h5"
    base.save_weights(weights)
    make_pets(root / "in", per_class=12, noise=20)
    convert(
        root / "in", root / "records", ConvertOptions(image_size=SIZE, val_fraction=0.25, test_fraction=0.25, workers=1)
    )
    return root, weights, {w.path: w.numpy() for w in base.weights}


@pytest.fixture(scope="module")
def finetuned_run(setup, tmp_path_factory):
    """A run of two epochs, the base frozen in the first (`finetune.freeze_epochs=1`) and trained from block5 on in
    the second (`finetune.unfreeze_from`), by `run.py` so that its folder holds `.hydra/config.yaml`: shared by the
    tests that read the phases' weights, the saved model's preprocessing and `checkpoint=RUN` alone. Returns the
    folder and the Python warnings the run gave."""
    root, weights, _ = setup
    run_dir = tmp_path_factory.mktemp("finetuned") / "run"
    phases = ["trainer.epochs=2", "finetune.freeze_epochs=1", "finetune.unfreeze_from=block5_conv1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_cli([*_overrides(root, weights, *phases), f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, [str(warning.message) for warning in caught]


def _overrides(root, weights, *extra):
    return [
        "dataset=cats_dogs",
        f"dataset.data_dir={root / 'records'}",
        f"dataset.stored_size={SIZE}",
        f"dataset.image_size={SIZE}",
        "model=vgg19_imagenet",
        f"model.weights={weights}",
        "model.fc_units=16",
        "trainer.batch_size=6",
        "trainer.steps_per_epoch=2",
        "trainer.verbose=0",
        "optimizer=sgd",
        "optimizer.lr=0.05",
        *extra,
    ]


def _base_weights(run_dir):
    model = keras.saving.load_model(run_dir / "checkpoints" / "last.keras")
    return {layer.name: [w.numpy() for w in layer.weights] for layer in base_layers(model)}


def _original(initial, layer):
    return [initial[f"{layer}/kernel"], initial[f"{layer}/bias"]] if f"{layer}/kernel" in initial else []


@pytest.mark.integration
def test_the_base_is_kept_bit_for_bit_but_from_unfreeze_from_on(setup, finetuned_run):
    """Phase one (epoch 1) trains the head alone, phase two (epoch 2) the head and block5: every layer before
    block5 ends as the weights file gave it."""
    _, _, initial = setup
    run_dir, warned = finetuned_run
    trained = _base_weights(run_dir)
    for layer, values in trained.items():
        if not values:
            continue
        same = all(np.array_equal(a, b) for a, b in zip(values, _original(initial, layer), strict=True))
        assert same == (not layer.startswith("block5")), layer
    head = keras.saving.load_model(run_dir / "checkpoints" / "last.keras").get_layer("vgg19_imagenet")
    assert head.get_layer("fc1").trainable
    assert len(csv_rows(run_dir / "history.csv")) == 2, "two epochs, each once, across the two phases"
    # The switch restores no stale optimizer state, and the schedule's restart is said.
    assert not [message for message in warned if "Skipping variable loading" in message]
    log = (run_dir / "run.log").read_text()
    assert "Epochs 2-2: the cosine schedule starts again from lr 0.005 over these 1 epochs" in log


@pytest.mark.unit
def test_the_model_applies_the_preprocessing_the_weights_expect(finetuned_run):
    model = keras.saving.load_model(finetuned_run[0] / "checkpoints" / "best.keras")
    assert model.input.dtype == "uint8"
    image = np.random.default_rng(0).integers(0, 256, (2, SIZE, SIZE, 3)).astype(np.uint8)
    network = model.get_layer("vgg19_imagenet")
    expected = network.predict(keras.applications.vgg19.preprocess_input(image.astype(np.float32)), verbose=0)
    np.testing.assert_allclose(model.predict(image, verbose=0), expected, atol=1e-5)


@pytest.mark.integration
def test_evaluate_and_export_with_only_the_run_folder(finetuned_run, tmp_path):
    """A vgg19_imagenet run evaluated without repeating model=vgg19_imagenet: its caffe preprocessing is its own."""
    run_dir, _ = finetuned_run
    result = run_cli(["mode=evaluate", f"checkpoint={run_dir}", f"hydra.run.dir={tmp_path / 'e'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert evaluated["accuracy"] == json.loads((run_dir / "metrics.json").read_text())["test_accuracy"]
    assert evaluated["loss"] == pytest.approx(json.loads((run_dir / "metrics.json").read_text())["test_loss"])


@pytest.mark.integration
@pytest.mark.parametrize("case, message", [("missing", "no such file"), ("mismatch", "does not match VGG19")])
def test_bad_weights_files_are_clear_errors(setup, tmp_path, case, message):
    root, _, _ = setup
    weights = tmp_path / "w.weights.h5"
    if case == "mismatch":
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]).save_weights(weights)
    with pytest.raises(DataError, match=message) as error:
        run_task(compose(_overrides(root, weights, "trainer.epochs=1"), tmp_path / "run"))
    assert str(weights) in str(error.value)


@pytest.mark.slow  # 36 s; test_serving checks every format of an export in this process
@pytest.mark.e2e
def test_export_round_trip_in_a_fresh_process(setup, tmp_path):
    root, weights, _ = setup
    run_task(compose(_overrides(root, weights, "trainer.epochs=1", "finetune.freeze_epochs=1"), tmp_path / "run"))
    export_dir = tmp_path / "serving"
    typed = ["mode=export", f"checkpoint={tmp_path / 'run' / 'checkpoints' / 'best.keras'}", f"export.dir={export_dir}"]
    run_task(compose(typed, tmp_path / "export_run"), overrides=typed)  # a bare .keras file: nothing else needed
    info = json.loads((export_dir / "serving_info.json").read_text())
    assert info["class_names"] == ["Cat", "Dog"] and info["input"]["dtype"] == "uint8"
    rng = np.random.default_rng(1)
    small = rng.integers(0, 256, (2, 20, 28, 3)).astype(np.uint8)
    large = rng.integers(0, 256, (1, 70, 50, 3)).astype(np.uint8)
    np.save(tmp_path / "small.npy", small)
    np.save(tmp_path / "large.npy", large)
    script = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        assert not any(name.startswith("trainer") for name in sys.modules)
        served = tf.saved_model.load({str(export_dir / "1")!r})
        for name in ("small", "large"):
            images = np.load({str(tmp_path)!r} + f"/{{name}}.npy")
            np.save({str(tmp_path)!r} + f"/{{name}}_served.npy", served.serve(tf.constant(images))["probabilities"])
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    model = keras.saving.load_model(tmp_path / "run" / "checkpoints" / "best.keras")
    for name, images in (("small", small), ("large", large)):
        expected = model.predict(to_model_size(tf.constant(images), SIZE), verbose=0)  # the one resize
        served = np.load(tmp_path / f"{name}_served.npy")
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(DataError, match="already exists"):
        run_task(
            compose(
                _overrides(root, weights, "mode=export", f"checkpoint={tmp_path / 'run'}", f"export.dir={export_dir}"),
                tmp_path / "again",
            )
        )
