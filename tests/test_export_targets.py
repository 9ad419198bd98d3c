"""The deploy targets users ask for: OpenVINO, int8 that says what it costs, embeddings and a model card.

One tiny model is trained for this module (`tiny_run`); every export of it runs `mode=export` in process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml

from conftest import cifar_overrides, run_cli, write_cifar
from trainer.errors import ConfigError, DataError
from trainer.models.preprocessing import build_models
from trainer.runs import checkpoints
from trainer.serving import bundle, embeddings, model_card, portable, saved_model
from trainer.serving.runners import in_batches, load_runner, onnx_runner

TINY = ["model.width_multiplier=0.0625", "dataset.image_size=32", "trainer.epochs=1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """(CIFAR-format data folder, run folder) of one tiny model trained for one epoch on 48 test images."""
    root = tmp_path_factory.mktemp("targets")
    data = write_cifar(root / "cifar", records_per_file=16, num_test=48)
    run_dir = root / "run"
    result = run_cli([*cifar_overrides(data), *TINY, f"hydra.run.dir={run_dir}"], cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return data, run_dir


def _export(run_dir: Path, export_dir: Path, *overrides: str):
    return run_cli(["mode=export", f"checkpoint={run_dir}", f"export.dir={export_dir}", *overrides])


# --- one line for each bad input ------------------------------------------------------------------------------


@pytest.mark.integration
def test_an_unknown_export_format_is_one_line_listing_the_formats(tmp_path):
    result = run_cli(["mode=export", "checkpoint=x.keras", f"export.dir={tmp_path / 's'}", "export.format=tensorrt"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    line = next(line for line in result.stderr.splitlines() if "export.format" in line)
    for format in (*bundle.FORMATS, "all"):
        assert format in line, line


@pytest.mark.unit
def test_openvino_without_its_package_is_one_line_naming_the_install_command(monkeypatch):
    real = portable.importlib.util.find_spec
    monkeypatch.setattr(portable.importlib.util, "find_spec", lambda name: None if name == "openvino" else real(name))
    with pytest.raises(ConfigError, match=r'format=openvino needs openvino: .*pip install -e "\.\[export\]"'):
        portable.require_extra("openvino")


@pytest.mark.unit
def test_embeddings_of_a_model_without_a_penultimate_layer_to_read_is_one_line():
    inputs = keras.Input((8, 8, 3), dtype="uint8")
    flat = keras.layers.Flatten()(keras.layers.Rescaling(1.0)(inputs))
    no_head = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="classes")(flat))
    with pytest.raises(ConfigError, match="reads the features entering the layer named 'predictions'.*has none"):
        embeddings.embedding_model(no_head)
    after = keras.layers.Dense(3, activation="softmax", name="predictions")(flat)
    head_not_last = keras.Model(inputs, keras.layers.Softmax()(after))  # something follows the head
    with pytest.raises(ConfigError, match="predict.embeddings=true: layer 'predictions' is not the last step"):
        embeddings.embedding_model(head_not_last, "predict.embeddings")


@pytest.mark.unit
def test_int8_below_its_floor_is_one_line_naming_the_figure_and_the_remedies():
    measured = {"top1_agreement": 0.87, "agreeing_images": 174, "images": 200, "max_difference": 0.247}
    options = bundle.ExportOptions(quantize="int8", calibration=np.zeros((300, 8, 8, 3), np.uint8))
    with pytest.raises(DataError) as raised:
        bundle._require_agreement("model_int8.tflite", measured, options)
    message = str(raised.value)
    assert "\n" not in message and "174 of 200 held-out images (87.0%)" in message
    assert "export.int8_min_agreement=0.98" in message and "0.247" in message
    assert "export.calibration_images, now 300" in message and "per channel" in message
    bundle._require_agreement("model_int8.tflite", {**measured, "top1_agreement": 0.98}, options)  # at the floor


@pytest.mark.unit
def test_the_model_card_of_a_bare_checkpoint_says_what_it_cannot_tell():
    info = {"class_names": ["a", "b"], "dataset": "", "files": {"onnx": {}}, "output": {"temperature": None}}
    info.update(image_size=32, resize_to=36, resize_mode="crop", normalization="standardize (inside the model)")
    card = model_card.render(info, model_card.read_run(None))
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] and "image-classification" in front["tags"] and front["metrics"] == []
    assert "Not recorded: no `metrics.json`" in card and "bare `.keras` file" in card
    assert "made square by `crop`, resized to 36 and centre-cropped to 32" in card


# --- the exports, each checked ----------------------------------------------------------------------------------


def check_card_against_metrics(card: str, metrics: dict, class_names: list[str]) -> int:
    """Every figure of MODEL_CARD.md that comes from training equals metrics.json's (to its 4 decimals).
    Returns how many figures were checked."""
    front = yaml.safe_load(card.split("---\n")[1])
    keys = {"accuracy": "test_accuracy", "f1": "test_macro_f1", "ece": "test_ece"}
    results = front["model-index"][0]["results"][0]["metrics"]
    assert {result["type"] for result in results} == set(keys) == set(front["metrics"])
    for result in results:
        assert result["value"] == metrics[keys[result["type"]]], result
    lines = {
        "Accuracy": "test_accuracy",
        "Macro F1": "test_macro_f1",
        "Expected calibration error (ECE)": "test_ece",
        "Temperature (fitted by the run's report)": "test_temperature",
    }
    checked = len(results)
    for label, key in lines.items():
        written = re.search(rf"^- {re.escape(label)}: (\S+)$", card, re.MULTILINE).group(1)
        assert written == f"{metrics[key]:.4f}", (label, written, metrics[key])
        checked += 1
    per_class = metrics["test_per_class"]
    rows = [line.split("|")[1:-1] for line in card.splitlines() if line.startswith("| ") and "|---" not in line]
    table = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows if len(row) == 5}
    table.pop("class")
    assert list(table) == class_names
    for index, name in enumerate(class_names):
        figures = per_class.get(name) or per_class[str(index)]
        f1, precision, recall, support = table[name]
        assert [f1, precision, recall] == [f"{figures[key]:.4f}" for key in ("f1", "precision", "recall")]
        assert int(support) == figures["support"]
        checked += 4
    split_sizes = re.search(r"^- Images per split: (.+)$", card, re.MULTILINE).group(1)
    assert split_sizes == ", ".join(f"{split} {count}" for split, count in metrics["num_examples"].items())
    return checked + len(metrics["num_examples"])


@pytest.mark.integration
@pytest.mark.slow  # ~2 min here: every format, int8, embeddings, with their checks
def test_every_format_with_embeddings_and_int8_is_checked_and_carded(tiny_run, tmp_path):
    data_dir, run_dir = tiny_run
    export_dir = tmp_path / "serving"
    typed = ["export.format=all", "export.quantize=int8", "export.embeddings=true", "export.int8_min_agreement=0"]
    result = _export(run_dir, export_dir, *typed, "export.calibration_images=32")
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((export_dir / bundle.INFO_FILE).read_text())
    files, checked = info["files"], info["check"]["images"]
    assert set(files) == set(bundle.FORMATS)
    # OpenVINO: model.xml and model.bin, uint8 in, named probabilities out, as close to Keras as the others.
    assert (export_dir / "model.xml").is_file() and (export_dir / "model.bin").is_file()
    vino = files["openvino"]
    side = info["image_size"]  # the model's input: the run's crop of its 32-pixel images
    assert vino["input"]["dtype"] == "uint8" and vino["input"]["shape"] == [None, side, side, 3]
    assert vino["output"]["name"] == "probabilities" and vino["max_difference"] <= bundle.FLOAT_TOLERANCE
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    images = np.random.default_rng(1).integers(0, 256, (5, side, side, 3), dtype=np.uint8)
    expected = model.predict(images, verbose=0)
    got = load_runner("openvino", export_dir / "model.xml")(images)
    np.testing.assert_allclose(got, expected, atol=bundle.FLOAT_TOLERANCE)
    # int8: its agreement with the float model on the held-out check images, as measured here.
    quantized = files["litert"]["quantized"]
    int8 = in_batches(load_runner("litert", export_dir / "model_int8.tflite"), images)
    assert quantized["images"] == checked and 0 <= quantized["top1_agreement"] <= 1
    assert quantized["agreeing_images"] == round(quantized["top1_agreement"] * checked)
    assert quantized["max_difference"] > 0 and np.abs(int8 - expected).max() < 0.5
    # Embeddings: the SavedModel's `embed` and the ONNX file's second output, unit length, their size recorded.
    size = info["embeddings"]["size"]
    stored = np.random.default_rng(2).integers(0, 256, (5, info["resize_to"], info["resize_to"], 3), dtype=np.uint8)
    embedded = load_runner("saved_model", export_dir / saved_model.VERSION, "embed")(stored)  # resized as `serve`
    assert embedded.shape == (5, size) and np.allclose(np.linalg.norm(embedded, axis=1), 1, atol=1e-5)
    crop = (info["resize_to"] - side) // 2  # the centre crop `embed` takes, as the test evaluation does
    centre = np.ascontiguousarray(stored[:, crop : crop + side, crop : crop + side])
    np.testing.assert_allclose(onnx_runner(export_dir / "model.onnx", "embeddings")(centre), embedded, atol=1e-4)
    np.testing.assert_allclose(load_runner("onnx", export_dir / "model.onnx")(images), expected, atol=1e-4)
    # The model card: every training figure is metrics.json's.
    metrics = json.loads((run_dir / "metrics.json").read_text())
    card = (export_dir / bundle.MODEL_CARD).read_text()
    assert check_card_against_metrics(card, metrics, info["class_names"]) >= 4 + 4 * 10
    for digest in json.loads((run_dir / "data.json").read_text())["sha256"]:
        assert f"| `{digest[0]}` | {digest[1]} | `{digest[2]}` |" in card
    assert "Precision trained in: float32" in card and "model.width_multiplier=0.0625" in card


@pytest.mark.integration
@pytest.mark.slow  # ~1 min
def test_int8_with_uint8_output_is_checked_through_its_output_scale_and_held_to_its_floor(tiny_run, tmp_path):
    _, run_dir = tiny_run
    typed = ["export.format=litert", "export.quantize=int8", "export.integer_io=true", "export.calibration_images=1"]
    result = _export(run_dir, tmp_path / "s", *typed, "export.int8_min_agreement=1.0")
    if result.returncode == 0:  # it kept every top-1 class even so: the floor of 1.0 held
        quantized = json.loads((tmp_path / "s" / bundle.INFO_FILE).read_text())["files"]["litert"]["quantized"]
        assert quantized["top1_agreement"] == 1.0
    else:
        assert "export.quantize=int8: model_int8.tflite keeps the float model's top-1 class on" in result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "s").exists()
    result = _export(run_dir, tmp_path / "q", *typed[:3], "export.int8_min_agreement=0")
    assert result.returncode == 0, result.stderr[-3000:]
    quantized = json.loads((tmp_path / "q" / bundle.INFO_FILE).read_text())["files"]["litert"]["quantized"]
    output = quantized["output"]
    assert output["dtype"] == "uint8" and output["scale"] > 0  # probabilities = (q - zero_point) * scale
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tmp_path / "q" / "model_int8.tflite"))
    assert interpreter.get_input_details()[0]["dtype"] == np.uint8
    assert interpreter.get_output_details()[0]["dtype"] == np.uint8
    assert quantized["max_difference"] < 0.5 and quantized["images"] == 48


@pytest.mark.integration
@pytest.mark.slow  # ~20 s: an int8 conversion
def test_int8_that_loses_the_top_class_stops_the_export_naming_the_figure(tmp_path):
    """Near-uniform probabilities (a head of tiny weights): the float model's top class differs from image to
    image by less than int8's step, so the int8 file loses it on many of them."""
    inputs = keras.Input((8, 8, 3))
    features = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, name="conv")(inputs))
    small = keras.initializers.RandomNormal(stddev=1e-3, seed=0)
    head = keras.layers.Dense(3, activation="softmax", kernel_initializer=small, name="predictions")(features)
    model = build_models(keras.Model(inputs, head), "standardize").inference
    info = checkpoints.ModelInfo(("a", "b", "c"), 8, 8, "standardize")
    pixels = np.random.default_rng(0).integers(0, 256, (200, 8, 8, 3), dtype=np.uint8)
    check = bundle.CheckImages(pixels[100:], None, "held-out pixels")
    options = bundle.ExportOptions(quantize="int8", calibration=pixels[:100])
    assert len(set(np.argmax(model.predict(check.images, verbose=0), axis=1))) > 1  # the float answers vary
    with pytest.raises(DataError, match=r"model_int8.tflite keeps the float model's top-1 class on \d+ of 100 "):
        bundle.write_export(model, info, tmp_path / "serving", ["litert"], check, options)
    assert not (tmp_path / "serving").exists()
    measured = bundle.write_export(
        model, info, tmp_path / "kept", ["litert"], check, bundle.ExportOptions("int8", pixels[:100], False, 0.0)
    )["files"]["litert"]["quantized"]
    assert measured["top1_agreement"] < 0.98 and measured["agreeing_images"] == round(100 * measured["top1_agreement"])
