"""ONNX, LiteRT and OpenVINO files of the inference model, written by Keras's own `model.export`.

    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=onnx
    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=litert export.quantize=int8
    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=openvino

Each takes uint8 [batch, size, size, 3] at the model's input size: the resize that `serve` does stays with
the client (TensorFlow's antialiased resize has no ONNX, LiteRT or OpenVINO op). They need the `[export]` extra.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer import quiet
from trainer.errors import ConfigError

EXTRA = {"onnx": ("tf2onnx", "onnxruntime"), "litert": ("ai_edge_litert",), "openvino": ("openvino",)}
QUANTIZATIONS = ("none", "float16", "int8")


def require_extra(format: str) -> None:
    """Raises ConfigError naming the `[export]` extra when a package that `format` needs is missing."""
    missing = [name for name in EXTRA.get(format, ()) if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f'export.format={format} needs {", ".join(missing)}: install the export extra, pip install -e ".[export]"'
        )


def _signature(model: keras.Model) -> list[tf.TensorSpec]:
    return [tf.TensorSpec([None, *model.input_shape[1:]], tf.uint8, name="images")]


def write_onnx(model: keras.Model, path: Path) -> Path:
    """`model` as ONNX (uint8 in, probabilities out), through tf2onnx (its INFO lines only with
    `trainer.tf_logs=true`: they reached the console through the root logger)."""
    logging.getLogger("tf2onnx").setLevel(logging.INFO if quiet.showing_logs() else logging.WARNING)
    model.export(str(path), format="onnx", input_signature=_signature(model), verbose=False)
    return path


def _representative(images: Iterable[np.ndarray]) -> Iterator[list[np.ndarray]]:
    for image in images:
        yield [image[np.newaxis]]


def write_litert(
    model: keras.Model,
    path: Path,
    quantize: str = "none",
    calibration: np.ndarray | None = None,
    integer_io: bool = False,
) -> Path:
    """`model` as a LiteRT flatbuffer (uint8 in, float32 probabilities out).

    Args:
        quantize: `none`; `float16` (weights in float16); `int8` (weights and activations in int8,
            calibrated on `calibration`, uint8 images of the model's input size; float where an op has no
            int8 kernel; the converter quantizes convolution weights per channel).
        integer_io: with `int8`, the output is uint8 too (the probabilities quantized by the output tensor's
            scale and zero point), as edge accelerators take it; the input is the uint8 pixels either way.
    """
    options = {}
    if quantize == "float16":
        options = {"optimizations": [tf.lite.Optimize.DEFAULT], "target_spec": {"supported_types": [tf.float16]}}
    elif quantize == "int8":
        if calibration is None or not len(calibration):
            raise ConfigError("export.quantize=int8 needs training images to calibrate on (the run's dataset)")
        options = {
            "optimizations": [tf.lite.Optimize.DEFAULT],
            "representative_dataset": lambda: _representative(calibration),
        }
        if integer_io:
            options.update(inference_input_type=tf.uint8, inference_output_type=tf.uint8)
    elif quantize != "none":
        raise ConfigError(f"export.quantize must be one of {list(QUANTIZATIONS)}; got {quantize!r}")
    model.export(str(path), format="litert", input_signature=_signature(model), verbose=False, **options)
    return path


def write_openvino(model: keras.Model, path: Path, output_names: tuple[str, ...] = ("probabilities",)) -> Path:
    """`model` as an OpenVINO IR, `path` (`.xml`) and its weights beside it (`.bin`), uint8 in; the outputs
    named `output_names` (Keras names them after its graph's ops). The weights stay float32."""
    import openvino

    keras_file = path.with_name(f"keras_{path.name}")
    model.export(str(keras_file), format="openvino", input_signature=_signature(model), verbose=False)
    converted = openvino.Core().read_model(str(keras_file))
    for output, name in zip(converted.outputs, output_names, strict=True):
        output.get_tensor().set_names({name})
    openvino.save_model(converted, str(path), compress_to_fp16=False)  # its default halves the weights
    del converted
    for file in (keras_file, keras_file.with_suffix(".bin")):
        file.unlink()
    return path
