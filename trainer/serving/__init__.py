"""Serving a trained model: the formats `mode=export` writes, the runners that load them back, the self-check.

    python run.py mode=export checkpoint=RUN export.dir=serving/digits                       # SavedModel
    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=all     # + ONNX, LiteRT

- `saved_model`: `DIR/1/`, for TensorFlow Serving: `serve` takes uint8 images of any size, `serve_bytes`
  encoded JPEG, PNG, BMP or GIF strings; both resize as the model was evaluated.
- `onnx`: `DIR/model.onnx`, uint8 at the model's input size (Keras's `model.export(format="onnx")`).
- `litert`: `DIR/model.tflite` (and `model_float16.tflite` or `model_int8.tflite` with
  `export.quantize`), uint8 at the model's input size (Keras's `model.export(format="litert")`).

Every format is loaded back after writing and compared with Keras's `predict` (`bundle.py`).
"""
