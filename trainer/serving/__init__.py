"""Serving a trained model: the formats `mode=export` writes, the runners that load them back, the self-check.

    python run.py mode=export checkpoint=RUN export.dir=serving/digits                       # SavedModel
    python run.py mode=export checkpoint=RUN export.dir=serving/digits export.format=all     # + ONNX, LiteRT, OpenVINO

- `saved_model`: `DIR/1/`, for TensorFlow Serving: `serve` takes uint8 images of any size, `serve_bytes`
  encoded JPEG, PNG, BMP or GIF strings; both resize as the model was evaluated.
- `onnx`: `DIR/model.onnx`, uint8 at the model's input size (Keras's `model.export(format="onnx")`).
- `litert`: `DIR/model.tflite` (and `model_float16.tflite` or `model_int8.tflite` with
  `export.quantize`), uint8 at the model's input size (Keras's `model.export(format="litert")`).
- `openvino`: `DIR/model.xml` and `model.bin`, uint8 at the model's input size (Keras's
  `model.export(format="openvino")`), checked compiled in float32.

Every format is loaded back after writing and compared with Keras's `predict` (`bundle.py`); a quantized
LiteRT file is measured against the float model. `export.embeddings` adds the penultimate features
(`embeddings.py`); every export folder gets MODEL_CARD.md (`model_card.py`).
"""
