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
    """The SavedModel's `serve` (uint8 pixels), `serve_bytes` (encoded strings) or `embed` (uint8 pixels ->
    embeddings, with export.embeddings), via `tf.saved_model.load`."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))  # held by `run`: the function's variables live in it

    def run(images: np.ndarray) -> np.ndarray:
        output = "embeddings" if signature == "embed" else "probabilities"
        return getattr(loaded, signature)(tf.constant(images))[output].numpy()

    return run


def onnx_runner(path: Path, output: str = "probabilities") -> Runner:
    """The ONNX file in ONNX Runtime, on the CPU: its output `output` (the only one of a file without
    embeddings)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outputs = [output.name for output in session.get_outputs()]
    wanted = [output if output in outputs else outputs[0]]  # a file with embeddings names its two outputs

    def run(images: np.ndarray) -> np.ndarray:
        return session.run(wanted, {name: images})[0]

    return run


def litert_runner(path: Path, threads: int | None = None) -> Runner:
    """The `.tflite` file in the LiteRT interpreter (`ai-edge-litert`), resized to each batch."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    shape = [None]

    scale, zero_point = target["quantization"]  # a uint8 output (export.integer_io): its probabilities' step

    def run(images: np.ndarray) -> np.ndarray:
        if shape[0] != images.shape:
            interpreter.resize_tensor_input(source["index"], images.shape)
            interpreter.allocate_tensors()
            shape[0] = images.shape
        interpreter.set_tensor(source["index"], images)
        interpreter.invoke()
        output = interpreter.get_tensor(target["index"]).copy()
        if target["dtype"] == np.float32:
            return output
        return ((output.astype(np.float32) - zero_point) * scale).astype(np.float32)

    return run


FLOAT32_PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}  # OpenVINO's CPU default is bf16 where the CPU has it


def openvino_runner(path: Path, threads: int | None = None) -> Runner:
    """The OpenVINO IR (`model.xml`) on the CPU, compiled to compute in float32 (`FLOAT32_PRECISION`)."""
    import openvino

    config = {**FLOAT32_PRECISION, **({"INFERENCE_NUM_THREADS": threads} if threads else {})}
    compiled = openvino.Core().compile_model(str(path), "CPU", config)
    output = compiled.outputs[0]

    def run(images: np.ndarray) -> np.ndarray:
        return compiled(images)[output]

    return run


def load_runner(format: str, path: Path, signature: str = "serve") -> Runner:
    """The runner of `format` (saved_model, onnx, litert, openvino) for the file or folder `path` (a SavedModel's
    `signature`: `serve` or `serve_bytes`)."""
    if format == "saved_model":
        return saved_model_runner(Path(path), signature)
    loaders = {"onnx": onnx_runner, "litert": litert_runner, "openvino": openvino_runner}
    return loaders[format](Path(path))


def io_names(format: str, path: Path) -> dict[str, str]:
    """{"input": ..., "output": ...}: the names a client of `format` uses, as its own runtime reports them (a
    SavedModel's `serve` signature; ONNX Runtime's session; the LiteRT interpreter's tensors; OpenVINO's model)."""
    if format == "saved_model":
        import tensorflow as tf

        serve = tf.saved_model.load(str(path)).signatures["serve"]
        inputs, outputs = serve.structured_input_signature[1], serve.structured_outputs
        return {"input": next(iter(inputs)), "output": next(iter(outputs))}
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = [output.name for output in session.get_outputs()]
        return {
            "input": session.get_inputs()[0].name,
            "output": "probabilities" if "probabilities" in outputs else outputs[0],
        }
    if format == "openvino":
        import openvino

        converted = openvino.Core().read_model(str(path))
        return {"input": converted.inputs[0].get_any_name(), "output": converted.outputs[0].get_any_name()}
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    return {
        "input": interpreter.get_input_details()[0]["name"],
        "output": interpreter.get_output_details()[0]["name"],
    }


def in_batches(runner: Runner, images: np.ndarray, batch: int = 32) -> np.ndarray:
    """`runner` over `images`, `batch` at a time."""
    return np.concatenate([runner(images[start : start + batch]) for start in range(0, len(images), batch)])
