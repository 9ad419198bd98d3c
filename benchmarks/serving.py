"""Inference latency of each export format against Keras's `predict`, on this CPU, in one process.

    python -m benchmarks --only serving

The demo's model (quarter-width VGG19 with batch norm, 32x32, random weights: the int8 agreement floor
is off) as `mode=export export.format=all export.quantize=int8` writes it; each format is timed with the
runtime that serves it (the SavedModel's `serve`, ONNX Runtime, the LiteRT interpreter, OpenVINO on the
CPU in float32 and in its default precision), at batch 1 and batch 32, per image.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Row, demo_model

ROUNDS = 3  # alternating rounds, the best of each: this machine's noise is larger than some differences


def _seconds_per_call(run, images: np.ndarray, seconds: float) -> float:
    for _ in range(3):
        run(images)  # warm-up: tracing, allocation
    times, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        begin = time.perf_counter()
        run(images)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def _runners(folder: Path) -> dict:
    import keras

    from trainer.models.preprocessing import build_models
    from trainer.runs.checkpoints import ModelInfo
    from trainer.serving import bundle
    from trainer.serving.runners import litert_runner, load_runner, openvino_runner

    keras.utils.set_random_seed(0)
    model = build_models(demo_model()).inference
    info = ModelInfo(tuple(str(index) for index in range(10)), 32, 32, "standardize")
    images = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    check = bundle.CheckImages(images, None, "random pixels")
    export = folder / "serving"
    options = bundle.ExportOptions(quantize="int8", calibration=images, int8_min_agreement=0)  # random weights
    bundle.write_export(model, info, export, list(bundle.FORMATS), check, options)
    threads = os.cpu_count()
    return {
        "Keras predict": lambda batch: model.predict(batch, verbose=0),
        "SavedModel (serve)": load_runner("saved_model", export / "1"),
        "ONNX Runtime": load_runner("onnx", export / "model.onnx"),
        "LiteRT float32": litert_runner(export / "model.tflite", threads),
        "LiteRT int8": litert_runner(export / "model_int8.tflite", threads),
        "OpenVINO float32": openvino_runner(export / "model.xml", threads),
        "OpenVINO default precision": _openvino_default(export / "model.xml", threads),
    }


def _openvino_default(path: Path, threads: int):
    """OpenVINO as a client that sets no precision gets it: bf16 on a CPU with AVX512-BF16 or AMX (the export's
    check, and `openvino_runner`, ask for float32)."""
    import openvino

    compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads})
    return lambda images: compiled(images)[compiled.outputs[0]]


def serving(folder: Path, quick: bool) -> list[Row]:
    runners = _runners(folder)
    seconds = 0.3 if quick else 2.0
    rng = np.random.default_rng(1)
    rows = []
    for batch in (1, 32):
        images = rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)
        best = {name: float("inf") for name in runners}
        for _ in range(1 if quick else ROUNDS):
            for name, run in runners.items():
                best[name] = min(best[name], _seconds_per_call(run, images, seconds) / batch)
        baseline = best.pop("Keras predict") * 1e6
        for name, value in best.items():
            rows.append(
                Row(
                    f"Inference latency per image, batch {batch}: {name} vs Keras predict",
                    value * 1e6,
                    baseline,
                    "us",
                    None,
                    higher_is_better=False,
                )
            )
    return rows
