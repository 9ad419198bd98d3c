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
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer.data.decode import MAX_PIXELS
from trainer.data.preprocess import Preprocess, prepare_images
from trainer.errors import DataError
from trainer.runs.atomic import atomic_folder
from trainer.runs.checkpoints import ModelInfo
from trainer.serving import portable, saved_model
from trainer.serving.runners import Runner, in_batches, io_names, load_runner

log = logging.getLogger(__name__)

FORMATS = ("saved_model", "onnx", "litert")
FLOAT_TOLERANCE = 1e-4  # largest |probability difference| from Keras's predict for a float format
INFO_FILE = "serving_info.json"


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
    model: keras.Model, info: ModelInfo, folder: Path, check: CheckImages, expected, max_pixels: int
) -> dict:
    """`folder/1` with `serve` and `serve_bytes`, both sent the images as a client holds them: `serve` the pixels,
    `serve_bytes` the same images as PNG (lossless); each against Keras's predict on what the test evaluation
    prepares of them."""
    path = saved_model.write_saved_model(model, folder, info, max_pixels)
    measured = _measure(load_runner("saved_model", path), check.images, expected, check.labels)
    _require_close(f"{path.name}/ (serve)", measured, len(check.images))
    encoded = _measure(load_runner("saved_model", path, "serve_bytes"), _png(check.images), expected, None)
    _require_close(f"{path.name}/ (serve_bytes, PNG)", encoded, len(check.images))
    return {
        "path": path.name,
        "signatures": saved_model.SIGNATURES,
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


def _litert(
    model: keras.Model, info: ModelInfo, folder: Path, check: CheckImages, expected, quantize: str, calibration
) -> dict:
    """model.tflite (float), checked; with `quantize`, also model_QUANTIZE.tflite, measured but not held to the
    float tolerance."""
    entry = {**_checked("litert", portable.write_litert(model, folder / "model.tflite"), check, expected)}
    entry.update(_portable_io("litert", folder / "model.tflite", info))
    if quantize != "none":
        path = portable.write_litert(model, folder / f"model_{quantize}.tflite", quantize, calibration)
        entry["quantized"] = {"quantize": quantize, **_checked("litert", path, check, expected, tolerance=False)}
    return entry


def write_export(
    model: keras.Model,
    info: ModelInfo,
    export_dir: str | os.PathLike,
    formats: list[str],
    check: CheckImages,
    quantize: str = "none",
    calibration: np.ndarray | None = None,
    max_pixels: int = MAX_PIXELS,
    temperature: float | None = None,
) -> dict:
    """Writes `formats` of the inference `model` into the new folder `export_dir`, each checked, with
    serving_info.json (which records the `temperature` baked into `model`, if any). Returns its content.

    Raises:
        DataError: `export_dir` exists already (nothing is overwritten), or a float format fails its check.
        DiskError: the folder cannot be written (full disk, permissions); nothing is left of it.
    """
    export_dir = Path(export_dir)
    if export_dir.exists():
        raise DataError(f"export.dir={export_dir}: already exists; choose a new folder (nothing is overwritten)")
    with atomic_folder(export_dir, key="export.dir") as temporary:  # a failed export leaves nothing
        prepared = _prepared(check, info)  # what the portable formats take: the model's input, as evaluated
        expected = model.predict(prepared.images, verbose=0)  # the test evaluation's probabilities
        files = {}
        if "saved_model" in formats:
            files["saved_model"] = _saved_model(model, info, temporary, check, expected, max_pixels)
        if "onnx" in formats:
            files["onnx"] = _checked("onnx", portable.write_onnx(model, temporary / "model.onnx"), prepared, expected)
            files["onnx"].update(_portable_io("onnx", temporary / "model.onnx", info))
        if "litert" in formats:
            files["litert"] = _litert(model, info, temporary, prepared, expected, quantize, calibration)
        serving_info = _serving_info(info, files, check, _accuracy(expected, check.labels))
        serving_info["output"]["temperature"] = temperature  # softmax(log(p) / T) inside the model; null: none
        (temporary / INFO_FILE).write_text(json.dumps(serving_info, indent=2) + "\n")
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
