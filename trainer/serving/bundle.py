"""The export folder: every requested format written, loaded back, checked against Keras, and described.

    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=all export.quantize=int8

The folder appears whole or not at all: the formats are written into a temporary
folder beside it, checked, and renamed. Each file is loaded back with the
runtime users serve it with (`runners.py`) and its probabilities compared with
Keras's `predict` on the same images; a float format that differs by more than
`FLOAT_TOLERANCE` fails the export. `serving_info.json` records the class names,
each format's file and input, and what the check measured.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer.data.decode import MAX_PIXELS
from trainer.data.preprocess import Preprocess, prepare_images
from trainer.errors import DataError
from trainer.models.temperature import with_temperature
from trainer.runs.atomic import atomic_folder
from trainer.runs.checkpoints import ModelInfo
from trainer.serving import embeddings, portable, saved_model
from trainer.serving.runners import FLOAT32_PRECISION, Runner, in_batches, io_names, load_runner, onnx_runner

log = logging.getLogger(__name__)

FORMATS = ("saved_model", "onnx", "litert", "openvino")
FLOAT_TOLERANCE = 1e-4  # largest |probability difference| from Keras's predict for a float format
INFO_FILE = "serving_info.json"
MODEL_CARD = "MODEL_CARD.md"


@dataclass(frozen=True)
class CheckImages:
    """What the export is checked on: uint8 images as a client of `serve` sends them (the stored images, which
    the signature resizes and centre-crops as the test evaluation does), with their labels if known."""

    images: np.ndarray
    labels: np.ndarray | None
    source: str  # for the log and serving_info.json: "the test split of ..." or "random pixels"


def _size(path: Path) -> int:
    """The bytes of a file, or of the files in a folder (not the folders' own entries)."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def _accuracy(probabilities: np.ndarray, labels: np.ndarray | None) -> float | None:
    return None if labels is None else float(np.mean(np.argmax(probabilities, axis=1) == labels))


def _measure(runner: Runner, images: np.ndarray, expected: np.ndarray, labels: np.ndarray | None) -> dict:
    probabilities = in_batches(runner, images)
    return {
        "max_difference": float(np.max(np.abs(probabilities - expected))),
        "accuracy": _accuracy(probabilities, labels),
    }


def _require_close(file: str, measured: dict, count: int) -> None:
    if not measured["max_difference"] <= FLOAT_TOLERANCE:  # NaN fails too
        raise DataError(
            f"export check: {file} differs from Keras's predict by {measured['max_difference']:.3g} "
            f"(> {FLOAT_TOLERANCE:g}) on {count} images; nothing was written"
        )


def _png(images: np.ndarray) -> np.ndarray:
    return np.array([tf.io.encode_png(image).numpy() for image in images], dtype=object)


def _prepared(check: CheckImages, info: ModelInfo) -> CheckImages:
    """The check images as the model takes them: resized and centre-cropped as the test evaluation does."""
    images = np.asarray(prepare_images(check.images, Preprocess.for_evaluation(info.resize_to, info.image_size)))
    return CheckImages(images, check.labels, check.source)


def _saved_model(
    model: keras.Model, info: ModelInfo, folder: Path, check: CheckImages, expected, max_pixels: int, embedder=None
) -> dict:
    """`folder/1` with `serve` and `serve_bytes`, both sent the images as a client holds them: `serve` the pixels,
    `serve_bytes` the same images as PNG (lossless); each against Keras's predict on what the test evaluation
    prepares of them."""
    path = saved_model.write_saved_model(model, folder, info, max_pixels, embedder)
    measured = _measure(load_runner("saved_model", path), check.images, expected, check.labels)
    _require_close(f"{path.name}/ (serve)", measured, len(check.images))
    encoded = _measure(load_runner("saved_model", path, "serve_bytes"), _png(check.images), expected, None)
    _require_close(f"{path.name}/ (serve_bytes, PNG)", encoded, len(check.images))
    return {
        "path": path.name,
        "signatures": {**saved_model.SIGNATURES, **({"embed": saved_model.EMBED} if embedder else {})},
        **_named_io(io_names("saved_model", path)),
        "max_pixels": max_pixels,  # serve_bytes refuses a larger image (export.max_pixels)
        "bytes": _size(path),
        **measured,
        "max_difference_serve_bytes_png": encoded["max_difference"],
    }


def _named_io(names: dict[str, str]) -> dict:
    """The `serve` signature's input and output, named as TensorFlow reports them (of any size: no shape)."""
    return {
        "input": {"name": names["input"], "dtype": "uint8"},
        "output": {"name": names["output"], "dtype": "float32"},
    }


def _portable_io(format: str, path: Path, info: ModelInfo) -> dict:
    """The input and output of a portable format, named as its runtime names them."""
    names = io_names(format, path)
    return {
        "input": {"name": names["input"], "dtype": "uint8", "shape": [None, info.image_size, info.image_size, 3]},
        "output": {"name": names["output"], "dtype": "float32", "shape": [None, len(info.class_names)]},
    }


def _checked(format: str, path: Path, check: CheckImages, expected: np.ndarray, tolerance: bool = True) -> dict:
    measured = _measure(load_runner(format, path), check.images, expected, check.labels)
    if tolerance:
        _require_close(path.name, measured, len(check.images))
    return {"path": path.name, "bytes": _size(path), **measured}


def _agreement(runner, check: CheckImages, expected: np.ndarray) -> dict:
    """How a quantized file agrees with the float model on the held-out check images: the share whose top-1
    class it keeps, as a client's argmax reads it (where the output's step rounds the top two to a tie, the
    first wins), and the largest probability difference (of a uint8 output, read through its scale)."""
    probabilities = in_batches(runner, check.images)
    kept = np.argmax(probabilities, axis=1) == np.argmax(expected, axis=1)
    return {
        "top1_agreement": float(np.mean(kept)),
        "agreeing_images": int(np.sum(kept)),
        "max_difference": float(np.max(np.abs(probabilities - expected))),
        "accuracy": _accuracy(probabilities, check.labels),
    }


def _require_agreement(file: str, measured: dict, options: ExportOptions) -> None:
    if measured["top1_agreement"] >= options.int8_min_agreement:
        return
    raise DataError(
        f"export.quantize=int8: {file} keeps the float model's top-1 class on {measured['agreeing_images']} of "
        f"{measured['images']} held-out images ({100 * measured['top1_agreement']:.1f}%), below "
        f"export.int8_min_agreement={options.int8_min_agreement:g} (largest probability difference "
        f"{measured['max_difference']:.3g}); nothing was written. Calibrate on more training images "
        f"(export.calibration_images, now {len(options.calibration)}), or export float16 (export.quantize=float16): "
        f"the converter already quantizes weights per channel"
    )


def _quantized(model: keras.Model, folder: Path, check: CheckImages, expected, options: ExportOptions) -> dict:
    """model_QUANTIZE.tflite, measured against the float model on the check images (held out from the
    calibration, which reads the training split); int8 below `int8_min_agreement` fails the export."""
    quantize, integer_io = options.quantize, options.integer_io and options.quantize == "int8"
    path = portable.write_litert(model, folder / f"model_{quantize}.tflite", quantize, options.calibration, integer_io)
    measured = {**_agreement(load_runner("litert", path), check, expected), "images": int(len(check.images))}
    if quantize == "int8":
        _require_agreement(path.name, measured, options)
    output = quantized_output(path)
    return {"quantize": quantize, "path": path.name, "bytes": _size(path), **measured, "output": output}


def quantized_output(path: Path) -> dict:
    """The output tensor of a LiteRT file as its interpreter reports it: dtype and, for uint8
    (export.integer_io), the scale and zero point that give probabilities: (q - zero_point) * scale."""
    from ai_edge_litert.interpreter import Interpreter

    target = Interpreter(model_path=str(path)).get_output_details()[0]
    entry = {"name": target["name"], "dtype": np.dtype(target["dtype"]).name}
    if entry["dtype"] != "float32":
        scale, zero_point = target["quantization"]
        entry.update(scale=float(scale), zero_point=int(zero_point))
    return entry


def _litert(
    model: keras.Model, info: ModelInfo, folder: Path, check: CheckImages, expected, options: ExportOptions
) -> dict:
    """model.tflite (float), checked; with `quantize`, also model_QUANTIZE.tflite (`_quantized`)."""
    entry = {**_checked("litert", portable.write_litert(model, folder / "model.tflite"), check, expected)}
    entry.update(_portable_io("litert", folder / "model.tflite", info))
    if options.quantize != "none":
        entry["quantized"] = _quantized(model, folder, check, expected, options)
    return entry


def _embeddings(
    embedder: keras.Model | None, folder: Path, check: CheckImages, prepared: CheckImages, files: dict
) -> dict | None:
    """With an `embedder`: what serving_info.json says of the embeddings, each format that carries them
    checked against Keras on the `prepared` images: the SavedModel's `embed` (sent the `check` images as a
    client holds them, as `serve` is), the ONNX file's `embeddings` output."""
    if embedder is None:
        return None
    expected = embedder.predict(prepared.images, verbose=0)
    entry = {"size": int(expected.shape[1]), "layer": f"the input of '{embeddings.HEAD}'", "norm": "L2 (unit length)"}
    if "saved_model" in files:
        path = folder / files["saved_model"]["path"]
        measured = _measure(load_runner("saved_model", path, "embed"), check.images, expected, None)
        _require_close(f"{path.name}/ (embed)", measured, len(check.images))
        entry["saved_model"] = {"signature": "embed", "output": "embeddings", **measured}
    if "onnx" in files:
        measured = _measure(onnx_runner(folder / "model.onnx", "embeddings"), prepared.images, expected, None)
        _require_close("model.onnx (embeddings)", measured, len(check.images))
        entry["onnx"] = {"output": "embeddings", **measured}
    for measured in (entry.get("saved_model"), entry.get("onnx")):
        if measured:
            measured.pop("accuracy")
    return entry


@dataclass(frozen=True)
class ExportOptions:
    """What `mode=export` asks of the files beyond their formats (the `export.*` keys)."""

    quantize: str = "none"  # none | float16 | int8: a second LiteRT file
    calibration: np.ndarray | None = None  # int8: training images of the model's input size
    integer_io: bool = False  # int8: uint8 output too (the input is uint8 pixels either way)
    int8_min_agreement: float = 0.98  # int8: the least share of held-out images whose top-1 class it keeps
    max_pixels: int = MAX_PIXELS  # serve_bytes refuses a larger image
    temperature: float | None = None  # baked into every format's probabilities (softmax(log(p) / T))
    embeddings: bool = False  # the SavedModel's `embed` and the ONNX file's second output
    model_card: Callable[[dict], str] | None = None  # serving_info.json's content -> MODEL_CARD.md


def write_export(
    model: keras.Model,
    info: ModelInfo,
    export_dir: str | os.PathLike,
    formats: list[str],
    check: CheckImages,
    options: ExportOptions = ExportOptions(),
) -> dict:
    """Writes `formats` of the inference `model` (with `options.temperature` baked in) into the new folder
    `export_dir`, each checked, with serving_info.json and, given `options.model_card`, MODEL_CARD.md.
    Returns serving_info.json's content.

    Raises:
        DataError: `export_dir` exists already (nothing is overwritten), a float format fails its check, or
            the int8 file keeps the float model's top-1 class on too few check images.
        DiskError: the folder cannot be written (full disk, permissions); nothing is left of it.
    """
    export_dir = Path(export_dir)
    if export_dir.exists():
        raise DataError(f"export.dir={export_dir}: already exists; choose a new folder (nothing is overwritten)")
    base, model = model, with_temperature(model, options.temperature)
    with atomic_folder(export_dir, key="export.dir") as temporary:  # a failed export leaves nothing
        prepared = _prepared(check, info)  # what the portable formats take: the model's input, as evaluated
        expected = model.predict(prepared.images, verbose=0)  # the test evaluation's probabilities
        embedder = embeddings.embedding_model(base) if options.embeddings else None
        both = embeddings.with_embeddings(base, options.temperature, names=True) if options.embeddings else model
        files = {}
        if "saved_model" in formats:
            files["saved_model"] = _saved_model(model, info, temporary, check, expected, options.max_pixels, embedder)
        if "onnx" in formats:
            files["onnx"] = _checked("onnx", portable.write_onnx(both, temporary / "model.onnx"), prepared, expected)
            files["onnx"].update(_portable_io("onnx", temporary / "model.onnx", info))
        if "litert" in formats:
            files["litert"] = _litert(model, info, temporary, prepared, expected, options)
        if "openvino" in formats:
            path = portable.write_openvino(model, temporary / "model.xml")
            files["openvino"] = {**_checked("openvino", path, prepared, expected), "weights": "model.bin"}
            files["openvino"]["bytes"] += _size(path.with_suffix(".bin"))
            files["openvino"].update(_portable_io("openvino", path, info), compile_config=FLOAT32_PRECISION)
        serving_info = _serving_info(info, files, check, _accuracy(expected, check.labels))
        serving_info["output"]["temperature"] = options.temperature  # softmax(log(p) / T) in the model; null: none
        serving_info["embeddings"] = _embeddings(embedder, temporary, check, prepared, files)
        (temporary / INFO_FILE).write_text(json.dumps(serving_info, indent=2) + "\n")
        if options.model_card is not None:
            (temporary / MODEL_CARD).write_text(options.model_card(serving_info), encoding="utf-8")
    return serving_info


def _serving_info(info: ModelInfo, files: dict, check: CheckImages, keras_accuracy: float | None) -> dict:
    class_names = list(info.class_names)
    return {
        "class_names": class_names,
        "signature": "serve",
        "input": {
            **saved_model.SIGNATURES["serve"],
            "note": "RGB pixels of any size; resized to the model input inside the graph",
        },
        "output": {"name": "probabilities", "dtype": "float32", "shape": [None, len(class_names)]},
        "resize_to": info.resize_to,
        "image_size": info.image_size,
        "resize_mode": info.resize_mode,  # trainer/serving/client_decode.py reads these three
        "normalization": f"{info.normalization} (inside the model)",
        "dataset": info.dataset,
        "trained_precision": info.precision or "not recorded",  # every file computes in float32 whatever it is
        "files": files,
        "check": {
            "images": int(len(check.images)),
            "source": check.source,
            "keras_accuracy": keras_accuracy,
            "float_tolerance": FLOAT_TOLERANCE,
        },
    }
