"""A trained run is self-contained: `checkpoint=RUN` alone evaluates, inspects, predicts and exports it with the run's
own dataset, and the model's class names, not today's defaults, name the predictions."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_cats_dogs import make_pets

from conftest import TINY_MODEL, compose, run_cli, tfrecord_parts
from trainer.data import pipeline, tfrecords
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.data.preprocess import Preprocess
from trainer.errors import DataError
from trainer.tasks import run_task

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cifar_run(trained_run):
    """(data folder's parent, run folder) of the session's tiny CIFAR-format run, trained by `run.py`, so its
    folder holds `.hydra/config.yaml`."""
    data, run_dir = trained_run
    return data.parent, run_dir


def test_evaluate_with_only_the_run_folder_equals_training(cifar_run, tmp_path):
    root, run_dir = cifar_run
    training = json.loads((run_dir / "metrics.json").read_text())
    out = tmp_path / "evaluate"
    result = run_cli(["mode=evaluate", f"checkpoint={run_dir}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(training["test_accuracy"], abs=1e-9)
    assert metrics["num_examples"] == 24, "the run's 24 CIFAR test records, not the bundled digits"
    log = (out / "run.log").read_text()
    assert f"Config of {run_dir}/.hydra/config.yaml reused" in log and "overridden here: nothing" in log


@pytest.mark.slow  # 14 s; tests/test_config_reuse.py keeps the merge rule in the default suite
def test_typed_keys_win_over_the_run_config(cifar_run, tmp_path):
    root, run_dir = cifar_run
    typed = ["mode=evaluate", f"checkpoint={run_dir}", "evaluate.split=val"]
    run_task(compose(typed, tmp_path / "val"), overrides=typed)
    assert json.loads((tmp_path / "val" / "metrics.json").read_text())["num_examples"] == 16
    moved = tmp_path / "moved"
    shutil.copytree(root / "cifar", moved)
    typed = ["mode=evaluate", f"checkpoint={run_dir}", f"dataset.data_dir={moved}"]
    run_task(compose(typed, tmp_path / "moved_eval"), overrides=typed)
    typed = ["mode=inspect", f"checkpoint={run_dir}", "inspect.split=test", "inspect.num_images=8"]
    run_task(compose(typed, tmp_path / "inspect"), overrides=typed)
    stats = json.loads((tmp_path / "inspect" / "inspect.json").read_text())
    assert stats["num_examples"] == 24 and stats["image_shape"] == [28, 28, 3] and stats["dtype"] == "uint8"


@pytest.mark.slow  # 13 s; test_serving's test_export_all_formats_each_checked_against_keras exports the same run
# from checkpoint=RUN alone and checks its sizes, the inference model's layers and serve against Keras
def test_export_with_only_the_run_folder_serves_the_keras_model(cifar_run, tmp_path):
    import keras

    _, run_dir = cifar_run
    typed = ["mode=export", f"checkpoint={run_dir}", f"export.dir={tmp_path / 'serving'}"]
    run_task(compose(typed, tmp_path / "export"), overrides=typed)
    info = json.loads((tmp_path / "serving" / "serving_info.json").read_text())
    assert info["class_names"][:2] == ["airplane", "automobile"] and (info["resize_to"], info["image_size"]) == (32, 28)
    served = tf.saved_model.load(str(tmp_path / "serving" / "1"))
    images = np.random.default_rng(3).integers(0, 256, (5, 32, 32, 3)).astype(np.uint8)
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    # dataset=cifar's flip and colour jitter trained it, in the training model only: the saved one is inference
    assert [layer.name for layer in model.layers] == ["image", "to_float", "standardize", "vgg19"]
    expected = model.predict(images[:, 2:30, 2:30], verbose=0)  # the evaluation centre crop
    np.testing.assert_allclose(served.serve(tf.constant(images))["probabilities"], expected, atol=1e-6)


def test_a_checkpoint_evaluated_on_data_with_other_classes_is_one_error(cifar_run, tmp_path):
    root, run_dir = cifar_run
    names = "[plane,car,bird,cat,deer,dog,frog,horse,ship,truck]"
    typed = ["mode=evaluate", f"checkpoint={run_dir}", f"dataset.class_names={names}"]
    with pytest.raises(DataError, match=r"trained on classes \['airplane', 'automobile', .* has \['plane', 'car'"):
        run_task(compose(typed, tmp_path / "e"), overrides=typed)
    checkpoint = f"checkpoint={run_dir}/checkpoints/best.keras"
    result = run_cli(["mode=evaluate", checkpoint, "dataset=digits", f"hydra.run.dir={tmp_path / 'digits'}"], cwd=root)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: checkpoint=") and "trained on classes ['airplane'" in last and "['0', '1'" in last


def test_predict_names_classes_as_the_converter_did_and_matches_evaluate(tmp_path):
    pets = tmp_path / "pets"
    make_pets(pets, per_class=16, noise=10)
    for name in ("Cat", "Dog"):
        (pets / name).rename(pets / name.lower())
    options = ConvertOptions(image_size=32, val_fraction=0.25, test_fraction=0.25, workers=1, classes=("dog", "cat"))
    manifest = convert(pets, tmp_path / "records", options)
    assert manifest["class_names"] == ["dog", "cat"]
    common = [
        "dataset=cats_dogs",  # its YAML still says class_names: [cat, dog]
        f"dataset.data_dir={tmp_path / 'records'}",
        "dataset.stored_size=32",
        "dataset.image_size=32",
        *TINY_MODEL,  # the three-layer test model: class names are the point
        "trainer.steps_per_epoch=4",
        "trainer.batch_size=4",
        "trainer.epochs=3",
    ]
    run_task(compose(common, tmp_path / "run"))
    test_accuracy = json.loads((tmp_path / "run" / "metrics.json").read_text())["test_accuracy"]

    # The test split's images as PNG files (lossless, stored size) in folders named as PetImages names them.
    folder = tmp_path / "photos"
    files = [str(tmp_path / "records" / name) for name in manifest["splits"]["test"]["files"]]
    spec = tfrecords.RecordSpec.for_format("raw", 32)
    count = 0
    source, decoder = tfrecord_parts(files, spec)
    for images, labels in pipeline.eval_dataset(source, decoder, Preprocess(32), 8):
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            (folder / ("Dog", "Cat")[label]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / ("Dog", "Cat")[label] / f"{count}.png")
            count += 1
    model_file = tmp_path / "model.keras"  # a bare .keras file: no run folder around it
    shutil.copy(tmp_path / "run" / "checkpoints" / "best.keras", model_file)
    output = tmp_path / "predictions.csv"
    typed = [*common, "mode=predict", f"checkpoint={model_file}", f"predict.input={folder}", f"predict.output={output}"]
    accuracy = run_task(compose(typed, tmp_path / "predict"))
    header = output.read_text().splitlines()[0].split(",")
    assert header[3:7] == ["predicted_class", "prob_dog", "prob_cat", "true_index"]
    rows = [line.split(",") for line in output.read_text().splitlines()[1:]]
    assert all(row[7] == ("dog" if row[0].startswith("Dog/") else "cat") for row in rows), "Dog/ holds dogs"
    assert all(row[6] == ("0" if row[0].startswith("Dog/") else "1") for row in rows), "dog is the model's class 0"
    assert accuracy == pytest.approx(test_accuracy, abs=1e-9) and count == manifest["splits"]["test"]["count"]


@pytest.mark.parametrize(
    "edit",
    ["unknown_key_and_no_preprocessing", pytest.param("no_preprocessing_and_no_name", marks=pytest.mark.slow)],
)
def test_a_hand_edited_model_section_is_one_line_in_every_mode(cifar_run, tmp_path, edit):
    from omegaconf import OmegaConf

    root, run_dir = cifar_run
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    del saved.model["preprocessing"]
    if edit == "unknown_key_and_no_preprocessing":
        saved.model.colour = "blue"
    else:
        del saved.model["name"]
    OmegaConf.save(saved, run / ".hydra" / "config.yaml")
    (run / "metrics.json").unlink()  # as if killed in its test evaluation: resume evaluates again
    for mode in ("evaluate", "predict", "export", "inspect", "resume"):
        arguments = [f"resume={run}"] if mode == "resume" else [f"mode={mode}", f"checkpoint={run}"]
        if mode == "predict":
            arguments += [f"predict.input={root / 'cifar'}/test_batch.bin", f"predict.output={tmp_path / mode}.csv"]
        if mode == "export":
            arguments += [f"export.dir={tmp_path / 'export'}"]
        if mode != "resume":
            arguments += [f"hydra.run.dir={tmp_path / mode}_run"]
        result = run_cli(arguments, cwd=tmp_path)
        assert "Traceback" not in result.stdout + result.stderr, (mode, result.stderr[-3000:])
        if "unknown_key" in edit:
            assert result.returncode == 1, (mode, result.stderr[-2000:])
            line = result.stderr.strip().splitlines()[-1]
            assert line.startswith("error: ") and "config.yaml" in line and "colour" in line, (mode, line)
        else:  # a key left out takes the schema's default
            assert result.returncode == 0, (mode, result.stderr[-2000:])


def test_class_names_match_in_any_letter_case_and_only_in_order(tmp_path):
    from trainer.runs import checkpoints

    info = checkpoints.ModelInfo(("Cat", "Dog"), 32, 32, "standardize")  # the converter's names, from Cat/ and Dog/
    checkpoints.check_data(tmp_path / "m.keras", info, ["cat", "dog"], 32, "predict.input")  # the config's names
    with pytest.raises(DataError, match=r"trained on classes \['Cat', 'Dog'\] but predict.input has \['dog', 'cat'\]"):
        checkpoints.check_data(tmp_path / "m.keras", info, ["dog", "cat"], 32, "predict.input")
