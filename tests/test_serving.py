"""What a run saves is what users deploy: `best.keras` is the inference model, Keras's own `model.export` serves
what `predict` gives, and `mode=export` writes SavedModel, ONNX and LiteRT files that check themselves."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import run_cli
from trainer.errors import ConfigError, DataError, one_line
from trainer.models.preprocessing import build_models
from trainer.runs import checkpoints
from trainer.serving import bundle, portable, saved_model
from trainer.serving.runners import in_batches, load_runner

RNG = np.random.default_rng(0)
SIZE = 24


def _tiny_model() -> tuple[keras.Model, checkpoints.ModelInfo]:
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    network = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="predictions")(x), name="tiny")
    keras.utils.set_random_seed(0)
    model = build_models(network, "standardize").inference
    return model, checkpoints.ModelInfo(("a", "b", "c"), SIZE, SIZE, "standardize")


@pytest.fixture(scope="module")
def tiny_saved_model(tmp_path_factory) -> tuple[keras.Model, Path]:
    model, info = _tiny_model()
    folder = tmp_path_factory.mktemp("saved")
    return model, saved_model.write_saved_model(model, folder, info)


def _test_images(data_dir: Path, count: int = 16) -> np.ndarray:
    """The first test records of `write_cifar`'s data, centre-cropped to the trained run's 28 pixels."""
    raw = np.frombuffer((data_dir / "test_batch.bin").read_bytes(), np.uint8).reshape(-1, 3073)[:count, 1:]
    images = raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images[:, 2:30, 2:30])


# --- the saved model is the inference model -----------------------------------------------------------------


@pytest.mark.integration
def test_best_keras_through_keras_own_export_serves_what_predict_gives(trained_run, tmp_path):
    """Keras's own SavedModel export of `best.keras` (the portable formats: the slow test below)."""
    data_dir, run_dir = trained_run
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    images = _test_images(data_dir)
    expected = model.predict(images, verbose=0)
    before = [np.asarray(weight) for weight in model.weights]
    bare = np.asarray(model(images))
    for old, new in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(old, np.asarray(new), err_msg=f"model(x) changed {new.path}")
    np.testing.assert_allclose(bare, expected, atol=1e-5)
    model.export(str(tmp_path / "keras_export"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "keras_export"))
    first, second = served.serve(images).numpy(), served.serve(images).numpy()
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, expected, atol=1e-5)


@pytest.mark.integration
@pytest.mark.slow  # three conversions; the default suite converts the same best.keras through the same model.export
# to each format and checks each against Keras (test_export_all_formats_each_checked_against_keras)
def test_best_keras_through_keras_own_portable_exports_serves_what_predict_gives(trained_run, tmp_path):
    """ONNX, LiteRT and OpenVINO from Keras's `model.export` alone."""
    data_dir, run_dir = trained_run
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    images = _test_images(data_dir)
    expected = model.predict(images, verbose=0)
    spec = [tf.TensorSpec([None, 28, 28, 3], tf.uint8, name="images")]
    model.export(str(tmp_path / "m.onnx"), format="onnx", input_signature=spec, verbose=False)
    np.testing.assert_allclose(load_runner("onnx", tmp_path / "m.onnx")(images), expected, atol=1e-5)
    model.export(str(tmp_path / "m.tflite"), format="litert", input_signature=spec, verbose=False)
    np.testing.assert_allclose(load_runner("litert", tmp_path / "m.tflite")(images), expected, atol=1e-5)
    model.export(str(tmp_path / "m.xml"), format="openvino", input_signature=spec, verbose=False)
    np.testing.assert_allclose(load_runner("openvino", tmp_path / "m.xml")(images), expected, atol=1e-5)


# --- serve_bytes ------------------------------------------------------------------------------------------------


def _encode(image: np.ndarray, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=format, **options)
    return buffer.getvalue()


@pytest.mark.integration
def test_serve_bytes_decodes_png_and_jpeg_to_the_pixels_pillow_gives(tiny_saved_model):
    _, path = tiny_saved_model
    images = RNG.integers(0, 256, (3, 30, 20, 3)).astype(np.uint8)  # another size: resized as `serve` resizes
    pixels, encoded = load_runner("saved_model", path), load_runner("saved_model", path, "serve_bytes")
    png = np.array([_encode(image, "PNG") for image in images], dtype=object)
    np.testing.assert_allclose(encoded(png), pixels(images), atol=1e-6)
    smooth = np.clip(np.cumsum(RNG.integers(-12, 13, (3, 30, 20, 3)), axis=2) + 128, 0, 255).astype(np.uint8)
    jpeg = [_encode(image, "JPEG", quality=95) for image in smooth]
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in jpeg])
    # The one decode uses libjpeg's accurate DCT, as Pillow does: the same pixels, so the same probabilities.
    np.testing.assert_allclose(encoded(np.array(jpeg, dtype=object)), pixels(decoded), atol=1e-6)
    bmp_gif = [_encode(images[0], "BMP"), _encode(images[0], "GIF")]
    assert encoded(np.array(bmp_gif, dtype=object)).shape == (2, 3)


@pytest.mark.integration
def test_a_string_that_is_no_image_fails_serve_bytes_naming_its_index(tiny_saved_model):
    _, path = tiny_saved_model
    good = _encode(RNG.integers(0, 256, (8, 8, 3)).astype(np.uint8), "PNG")
    encoded = load_runner("saved_model", path, "serve_bytes")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"image_bytes\[2\] is not a JPEG, PNG, GIF, BMP or WebP"):
        encoded(np.array([good, good, b"not an image", good], dtype=object))


@pytest.mark.integration
def test_a_truncated_image_fails_serve_bytes_naming_its_index(tiny_saved_model):
    """libjpeg's and libpng's own errors named no image: `Invalid JPEG data, size 459`."""
    _, path = tiny_saved_model
    photo = RNG.integers(0, 256, (60, 80, 3)).astype(np.uint8)
    good, jpeg, png = (_encode(photo, image_format) for image_format in ("PNG", "JPEG", "PNG"))
    encoded = load_runner("saved_model", path, "serve_bytes")
    cases = {  # cut inside the JPEG's header, inside the PNG's pixels
        1: (jpeg[:459], r"image_bytes\[1\]: corrupt or truncated image: its header does not read"),
        2: (png[: len(png) // 2], r"image_bytes\[2\]: corrupt or truncated image$"),
    }
    for index, (cut, message) in cases.items():
        batch = [good] * 4
        batch[index] = cut
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            encoded(np.array(batch, dtype=object))
        assert re.search(message, one_line(raised.value)), one_line(raised.value)
    assert encoded(np.array([good, jpeg], dtype=object)).shape == (2, 3)


@pytest.mark.integration
def test_the_client_reader_gives_serve_bytes_pixels_without_tensorflow_within_one_level():
    """docs/models.md's ONNX and LiteRT clients ignored EXIF, used Pillow's bicubic resize and hard-coded 224."""
    import subprocess
    import sys

    from trainer.serving import client_decode

    def saved(image: Image.Image, format: str, **options) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format=format, **options)
        return buffer.getvalue()

    def rotated(orientation: int, photo: np.ndarray) -> bytes:
        exif = Image.Exif()
        exif[0x0112] = orientation
        return saved(Image.fromarray(photo), "JPEG", quality=90, exif=exif.tobytes())

    smooth = lambda h, w: np.clip(np.cumsum(RNG.integers(-9, 10, (h, w, 3)), 1) + 128, 0, 255).astype(np.uint8)  # noqa: E731
    photo = smooth(150, 210)
    rgba = np.concatenate([photo, RNG.integers(0, 256, (150, 210, 1)).astype(np.uint8)], -1)
    files = {
        "exif 6": rotated(6, photo), "exif 3": rotated(3, smooth(61, 97)),
        "rgba": _encode(rgba, "PNG"), "cmyk": saved(Image.fromarray(photo).convert("CMYK"), "JPEG"),
        "16-bit gray": saved(Image.fromarray(photo[..., 0].astype(np.uint16) * 257 + 3), "PNG"),
        "16-bit rgb": tf.io.encode_png(tf.constant(photo.astype(np.uint16) * 257)).numpy(),
        "odd jpeg": _encode(smooth(37, 53), "JPEG"), "odd png": _encode(smooth(29, 71), "PNG"),
        "large": _encode(smooth(700, 900), "JPEG"),  # read at 1/8 in the DCT
    }  # fmt: skip
    for resize_to, size, mode in ((64, 64, "resize"), (72, 64, "crop"), (40, 32, "pad"), (160, 160, "resize")):
        info = checkpoints.ModelInfo(("a", "b"), size, resize_to, "none", resize_mode=mode)
        served = saved_model.bytes_pixels(info)(tf.constant(list(files.values()))).numpy()
        settings = {"resize_to": resize_to, "image_size": size, "resize_mode": mode}
        for (name, data), expected in zip(files.items(), served, strict=True):
            got = client_decode.read_image(data, settings)
            assert got.shape == (1, size, size, 3) and got.dtype == np.uint8
            difference = np.abs(got[0].astype(int) - expected.astype(int))
            assert difference.max() <= client_decode.MAX_DIFFERENCE, (name, mode, difference.max())
            assert difference.mean() < 0.05, (name, mode, difference.mean())
    blocked = "import sys; sys.modules['tensorflow'] = None; import trainer.serving.client_decode"
    assert subprocess.run([sys.executable, "-c", blocked], capture_output=True).returncode == 0, "Pillow + numpy"


# --- mode=export ------------------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow  # ~26 s alone; each format's export and check: tests/test_export_targets.py (in process)
def test_export_all_formats_each_checked_against_keras(trained_run, tmp_path):
    data_dir, run_dir = trained_run
    export_dir = tmp_path / "serving"
    typed = ["mode=export", f"checkpoint={run_dir}", f"export.dir={export_dir}", "export.format=all"]
    int8 = ["export.quantize=int8", "export.int8_min_agreement=0"]  # its floor: tests/test_export_targets.py
    result = run_cli([*typed, *int8, "export.check_images=24", f"hydra.run.dir={tmp_path / 'e'}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tf2onnx" not in result.stdout + result.stderr, "tf2onnx's INFO lines stay quiet"
    info = json.loads((export_dir / bundle.INFO_FILE).read_text())
    files = info["files"]
    assert set(files) == {"saved_model", "onnx", "litert", "openvino"}
    assert files["litert"]["quantized"]["quantize"] == "int8"
    assert info["check"]["images"] == 24 and "test split" in info["check"]["source"]
    assert info["class_names"][0] == "airplane" and files["onnx"]["input"]["shape"] == [None, 28, 28, 3]
    assert (info["resize_to"], info["image_size"]) == (32, 28), "the run's own sizes, from its folder alone"
    # Sizes are the files' bytes (no folder entries); input and output names as each runtime reports them.
    folder_files = [path for path in (export_dir / saved_model.VERSION).rglob("*") if path.is_file()]
    assert files["saved_model"]["bytes"] == sum(path.stat().st_size for path in folder_files)
    serve = tf.saved_model.load(str(export_dir / saved_model.VERSION)).signatures["serve"]
    assert files["saved_model"]["input"]["name"] == next(iter(serve.structured_input_signature[1]))
    assert files["saved_model"]["output"]["name"] == next(iter(serve.structured_outputs)) == "probabilities"
    import onnxruntime
    from ai_edge_litert.interpreter import Interpreter

    session = onnxruntime.InferenceSession(str(export_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert files["onnx"]["input"]["name"] == session.get_inputs()[0].name
    assert files["onnx"]["output"]["name"] == session.get_outputs()[0].name
    interpreter = Interpreter(model_path=str(export_dir / "model.tflite"))
    assert files["litert"]["input"]["name"] == interpreter.get_input_details()[0]["name"]
    assert files["litert"]["output"]["name"] == interpreter.get_output_details()[0]["name"]
    assert files["litert"]["output"]["shape"] == [None, 10]
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    # dataset=cifar's flip and colour jitter trained it, in the training model only: the saved one is inference
    assert [layer.name for layer in model.layers] == ["image", "to_float", "standardize", "vgg19"]
    images = _test_images(data_dir, 24)
    expected = model.predict(images, verbose=0)
    for format, file in (("onnx", "model.onnx"), ("litert", "model.tflite"), ("openvino", "model.xml")):
        got = in_batches(load_runner(format, export_dir / file), images)
        np.testing.assert_allclose(got, expected, atol=bundle.FLOAT_TOLERANCE, err_msg=format)
        assert files[format]["max_difference"] <= bundle.FLOAT_TOLERANCE
    int8 = in_batches(load_runner("litert", export_dir / "model_int8.tflite"), images)
    assert int8.shape == expected.shape and np.abs(int8 - expected).max() < 0.2  # quantized: close, not equal
    for line in ("onnx ", "litert ", "model_int8.tflite", "largest difference from Keras", "accuracy"):
        assert line in result.stdout
    assert (export_dir / saved_model.VERSION / "saved_model.pb").is_file()
    # `serve` is checked as a client uses it: sent the stored 32x32 images, which it resizes and crops itself.
    test_accuracy = json.loads((run_dir / "metrics.json").read_text())["test_accuracy"]  # the same 24 images
    assert info["check"]["keras_accuracy"] == pytest.approx(test_accuracy)
    assert files["saved_model"]["accuracy"] == pytest.approx(test_accuracy)
    raw = np.frombuffer((data_dir / "test_batch.bin").read_bytes(), np.uint8).reshape(-1, 3073)[:24, 1:]
    stored = np.ascontiguousarray(raw.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    served = in_batches(load_runner("saved_model", export_dir / saved_model.VERSION), stored)
    np.testing.assert_allclose(served, expected, atol=bundle.FLOAT_TOLERANCE)
    assert not (tmp_path / "e").exists(), "the export wrote its results elsewhere: no run folder of bookkeeping"


@pytest.mark.integration
@pytest.mark.slow  # 25 s: the default suite keeps the export that passes its check (test_export_all_formats...)
def test_an_export_that_fails_its_check_is_one_line_and_writes_nothing(trained_run, tmp_path, monkeypatch):
    _, run_dir = trained_run
    monkeypatch.setattr(bundle, "FLOAT_TOLERANCE", 0.0)  # no float export matches to the last bit
    export_dir = tmp_path / "serving"
    result = run_cli(["mode=export", f"checkpoint={run_dir}", f"export.dir={export_dir}", "export.check_images=8"])
    if result.returncode == 0:  # the SavedModel may match Keras exactly on this machine: then the check passed
        assert json.loads((export_dir / bundle.INFO_FILE).read_text())["files"]["saved_model"]["max_difference"] == 0
        return
    assert "export check: 1/ (serve) differs from Keras's predict by" in result.stderr
    assert not export_dir.exists() and not list(tmp_path.glob(".serving*")), "no temporary folder is left"


@pytest.mark.integration
@pytest.mark.slow  # 16 s
def test_a_bare_checkpoint_without_its_data_is_checked_on_random_pixels_but_not_calibrated(trained_run, tmp_path):
    _, run_dir = trained_run
    bare = tmp_path / "model.keras"
    bare.write_bytes((run_dir / "checkpoints" / "best.keras").read_bytes())  # no run folder: the default dataset
    result = run_cli(["mode=export", f"checkpoint={bare}", f"export.dir={tmp_path / 's'}", "export.check_images=4"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checked on random pixels" in result.stdout and "was trained on classes" in result.stdout
    typed = ["mode=export", f"checkpoint={bare}", f"export.dir={tmp_path / 'q'}", "export.format=litert"]
    result = run_cli([*typed, "export.quantize=int8"])
    assert result.returncode == 1 and not (tmp_path / "q").exists()
    assert "error: export.quantize=int8 calibrates on the training split" in result.stderr


@pytest.mark.unit
def test_quantize_applies_to_litert_only_and_a_missing_extra_is_one_line(monkeypatch):
    from trainer.config.schema import ExportConfig

    with pytest.raises(ConfigError, match="export.quantize must be none unless export.format is litert or all"):
        ExportConfig(dir="x", format="saved_model", quantize="int8")
    monkeypatch.setattr(portable.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r'format=onnx needs tf2onnx, onnxruntime: .*pip install -e "\.\[export\]"'):
        portable.require_extra("onnx")
    portable.require_extra("saved_model")  # TensorFlow's own: no extra


@pytest.mark.unit
def test_an_existing_export_folder_is_never_overwritten(tmp_path):
    model, info = _tiny_model()
    (tmp_path / "serving").mkdir()
    check = bundle.CheckImages(np.zeros((1, SIZE, SIZE, 3), np.uint8), None, "zeros")
    with pytest.raises(DataError, match="already exists"):
        bundle.write_export(model, info, tmp_path / "serving", ["saved_model"], check)


@pytest.mark.integration
def test_an_empty_batch_gets_an_empty_answer_from_both_signatures(tiny_saved_model):
    _, path = tiny_saved_model
    loaded = tf.saved_model.load(str(path))
    pixels = loaded.signatures["serve"](tf.zeros([0, SIZE, SIZE, 3], tf.uint8))["probabilities"]
    encoded = loaded.signatures["serve_bytes"](tf.constant([], tf.string))["probabilities"]
    assert pixels.shape == encoded.shape == (0, 3) and pixels.dtype == encoded.dtype == tf.float32


@pytest.mark.integration
@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "GIF", "BMP", "WebP"])
def test_serve_bytes_refuses_an_image_over_max_pixels_naming_its_index(tmp_path, image_format):
    """The size comes from the file's header, before any pixel is decoded: a 389 KB PNG of 20000 x 20000 took
    the serving process past 6 GB. The default limit is Pillow's."""
    from PIL import Image

    from trainer.config.schema import ExportConfig
    from trainer.data.decode import MAX_PIXELS

    assert ExportConfig().max_pixels == MAX_PIXELS == Image.MAX_IMAGE_PIXELS
    model, info = _tiny_model()
    path = saved_model.write_saved_model(model, tmp_path, info, max_pixels=1000)
    small, large = (_encode(RNG.integers(0, 256, (side, side, 3)).astype(np.uint8), image_format) for side in (30, 40))
    encoded = load_runner("saved_model", path, "serve_bytes")
    assert encoded(np.array([small], dtype=object)).shape == (1, 3)
    message = r"image_bytes\[1\]: decompression bomb: an image of 40 x 40 pixels, over the limit of 1000"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        encoded(np.array([small, large], dtype=object))


def _honest(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated three-class probabilities and labels drawn from them."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet([0.5, 0.5, 0.5], count).astype(np.float32)
    labels = np.array([rng.choice(3, p=row / row.sum()) for row in probabilities.astype(np.float64)])
    return probabilities, labels


@pytest.mark.unit
def test_a_temperature_is_fitted_only_on_enough_images_and_mistakes_and_held_within_its_bounds():
    """2 validation images fitted T=19.9 (every probability about 0.5); a split without a mistake T=0.05."""
    from trainer.evaluation import calibration

    probabilities, labels = _honest(2000, 1)
    two = calibration.fit_checked(probabilities[:2], labels[:2])
    assert two.temperature is None and two.unfitted.startswith("2 images with ")
    right = probabilities.argmax(axis=1) == labels
    flawless = calibration.fit_checked(probabilities[right][:500], labels[right][:500])
    assert flawless.temperature is None
    assert flawless.unfitted == (
        "500 images with 0 mistakes are too little evidence to fit a temperature on (it needs 10 images and 3 mistakes)"
    )
    honest = calibration.fit_checked(probabilities, labels)
    assert honest.temperature == pytest.approx(1.0, rel=0.15) and honest.bound is None and honest.at_bound == ""
    sharp = calibration.scale(probabilities, 0.1)  # over-confident: undoing it takes T=10, past the bound 4
    held = calibration.fit_checked(sharp, labels)
    assert held.temperature == held.bound == calibration.TEMPERATURES[1] == 4.0
    assert held.at_bound == "the NLL still falls past T=4, the bound of 0.25-4: T is held at 4"
    assert calibration.fit_checked(calibration.scale(probabilities, 5.0), labels).temperature == 0.25
    # Near-uniform answers over 200 classes: the NLL falls all the way to the bound, so flatly that the search
    # stopped 0.3% short of it (T=3.99) and said nothing of the bound.
    logits = np.random.default_rng(0).normal(0, 0.15, (200, 200))
    logits[:, 13] += 0.3  # every answer leans to class 13; each class is the label once
    flat = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    uniform = calibration.fit_checked(flat.astype(np.float32), np.arange(200))
    assert uniform.temperature == uniform.bound == 4.0, uniform


@pytest.mark.integration
def test_export_temperature_auto_refuses_to_bake_in_a_temperature_two_validation_images_cannot_tell(
    trained_run, tmp_path
):
    from conftest import compose
    from trainer.tasks import run_task

    _, run_dir = trained_run
    typed = ["mode=export", f"checkpoint={run_dir}", f"export.dir={tmp_path / 'serving'}", "export.format=onnx",
             "export.temperature=auto", "dataset.val_size=2"]  # fmt: skip
    with pytest.raises(DataError, match=r"^export.temperature=auto: the validation split's 2 images with [0-2] "
                                         r"mistakes are too little evidence .* \(export.temperature=T\)"):  # fmt: skip
        run_task(compose(typed, tmp_path / "e"), overrides=typed)
    assert not (tmp_path / "serving").exists()


@pytest.mark.integration
def test_export_temperature_auto_bakes_the_validation_fitted_temperature_into_every_format(trained_run, tmp_path):
    from conftest import compose
    from trainer.evaluation import calibration
    from trainer.tasks import run_task

    data_dir, run_dir = trained_run
    export_dir = tmp_path / "serving"
    typed = ["mode=export", f"checkpoint={run_dir}", f"export.dir={export_dir}", "export.format=onnx",
             "export.temperature=auto", "export.check_images=8"]  # fmt: skip
    run_task(compose(typed, tmp_path / "e"), overrides=typed)
    info = json.loads((export_dir / bundle.INFO_FILE).read_text())
    temperature = info["output"]["temperature"]
    reported = json.loads((run_dir / "metrics.json").read_text())["test_temperature"]
    assert temperature == pytest.approx(reported, rel=1e-6), "the report's temperature: the same val split, same fit"
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    images = _test_images(data_dir, 8)
    scaled = calibration.scale(model.predict(images, verbose=0), temperature)
    got = load_runner("onnx", export_dir / "model.onnx")(images)
    np.testing.assert_allclose(got, scaled, atol=bundle.FLOAT_TOLERANCE)
    assert not np.allclose(got, model.predict(images, verbose=0), atol=1e-3), "the temperature changed them"
    on_test = [*typed[:2], f"export.dir={tmp_path / 'never'}", "export.temperature=auto", "dataset.val_source=test"]
    with pytest.raises(DataError, match=r"^export.temperature=auto fits on the validation split, and the run's reads"):
        run_task(compose(on_test, tmp_path / "t"), overrides=on_test)
    assert not (tmp_path / "never").exists()


@pytest.mark.unit
@pytest.mark.parametrize("value", [0, -1, "warm", True])
def test_export_temperature_is_null_auto_or_positive(value):
    from trainer.config.schema import ExportConfig

    with pytest.raises(ConfigError, match=r"^export.temperature must be null, auto or a number > 0"):
        ExportConfig(dir="x", temperature=value)
