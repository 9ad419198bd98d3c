"""Each exported format loaded back with the runtime users serve it with, as `images -> probabilities`.

    from trainer.serving.runners import load_runner
    probabilities = load_runner("onnx", "serving/digits/model.onnx")(uint8_images)

The export checks itself with these (`trainer.tasks.export`), and the latency benchmark times them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[np.ndarray], np.ndarray]  # uint8 [batch, height, width, 3] -> float32 [batch, classes]


def saved_model_runner(path: Path, signature: str = "serve") -> Runner:
    """The SavedModel's `serve` (uint8 pixels) or `serve_bytes` (encoded strings), via `tf.saved_model.load`."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))  # held by `run`: the function's variables live in it

    def run(images: np.ndarray) -> np.ndarray:
        return getattr(loaded, signature)(tf.constant(images))["probabilities"].numpy()

    return run


def onnx_runner(path: Path) -> Runner:
    """The ONNX file in ONNX Runtime, on the CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(images: np.ndarray) -> np.ndarray:
        return session.run(None, {name: images})[0]

    return run


def litert_runner(path: Path, threads: int | None = None) -> Runner:
    """The `.tflite` file in the LiteRT interpreter (`ai-edge-litert`), resized to each batch."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    shape = [None]

    def run(images: np.ndarray) -> np.ndarray:
        if shape[0] != images.shape:
            interpreter.resize_tensor_input(source["index"], images.shape)
            interpreter.allocate_tensors()
            shape[0] = images.shape
        interpreter.set_tensor(source["index"], images)
        interpreter.invoke()
        return interpreter.get_tensor(target["index"]).copy()

    return run


def load_runner(format: str, path: Path, signature: str = "serve") -> Runner:
    """The runner of `format` (saved_model, onnx, litert) for the file or folder `path` (a SavedModel's
    `signature`: `serve` or `serve_bytes`)."""
    if format == "saved_model":
        return saved_model_runner(Path(path), signature)
    loaders = {"onnx": onnx_runner, "litert": litert_runner}
    return loaders[format](Path(path))


def io_names(format: str, path: Path) -> dict[str, str]:
    """{"input": ..., "output": ...}: the names a client of `format` uses, as its own runtime reports them (a
    SavedModel's `serve` signature; ONNX Runtime's session; the LiteRT interpreter's tensors)."""
    if format == "saved_model":
        import tensorflow as tf

        serve = tf.saved_model.load(str(path)).signatures["serve"]
        inputs, outputs = serve.structured_input_signature[1], serve.structured_outputs
        return {"input": next(iter(inputs)), "output": next(iter(outputs))}
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return {"input": session.get_inputs()[0].name, "output": session.get_outputs()[0].name}
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    return {
        "input": interpreter.get_input_details()[0]["name"],
        "output": interpreter.get_output_details()[0]["name"],
    }


def in_batches(runner: Runner, images: np.ndarray, batch: int = 32) -> np.ndarray:
    """`runner` over `images`, `batch` at a time."""
    return np.concatenate([runner(images[start : start + batch]) for start in range(0, len(images), batch)])
