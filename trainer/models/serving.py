"""Serving signatures: a trained model as a SavedModel that takes uint8 images of any size.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/cats_dogs

The folder is laid out for TensorFlow Serving: `EXPORT_DIR/1/` holds the
SavedModel (version 1), `EXPORT_DIR/serving_info.json` the model's class names
and input spec. The serving function only resizes (and centre-crops, as the
model was evaluated) uint8 images of any size; the normalization is the model's
own layers, so training and serving cannot drift apart, and a client sends raw
pixels and needs none of this project's code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from trainer.data.preprocess import Preprocess, prepare_images
from trainer.errors import DataError
from trainer.runs.checkpoints import ModelInfo

VERSION = "1"


def serving_function(model: keras.Model, info: ModelInfo):
    """uint8 [batch, height, width, 3] of any size -> {"probabilities": [batch, classes]}: the evaluation
    resize and centre crop, then the model (which normalizes)."""
    preprocess = Preprocess.for_evaluation(info.resize_to, info.image_size)

    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"probabilities": model(prepare_images(images, preprocess), training=False)}

    return serve


def export_serving(model: keras.Model, export_dir: str | os.PathLike, info: ModelInfo) -> Path:
    """Writes the SavedModel and serving_info.json into a new folder, atomically.

    Raises:
        DataError: `export_dir` already exists (nothing is overwritten) or cannot be created.
    """
    export_dir = Path(export_dir)
    if export_dir.exists():
        raise DataError(f"export.dir={export_dir}: already exists; choose a new folder (nothing is overwritten)")
    temporary = export_dir.parent / f".{export_dir.name}.tmp{os.getpid()}"
    try:
        temporary.mkdir(parents=True)
    except OSError as error:
        raise DataError(f"export.dir={export_dir}: cannot create it ({error.strerror})") from None
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            name="serve",
            fn=serving_function(model, info),
            input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
        )
        archive.write_out(str(temporary / VERSION), verbose=False)
        class_names = list(info.class_names)
        serving_info = {
            "class_names": class_names,
            "signature": "serve",
            "input": {
                "name": "images",
                "dtype": "uint8",
                "shape": [None, None, None, 3],
                "note": "RGB pixels of any size; resized to the model input inside the graph",
            },
            "output": {"name": "probabilities", "dtype": "float32", "shape": [None, len(class_names)]},
            "resize_to": info.resize_to,
            "image_size": info.image_size,
            "normalization": f"{info.normalization} (inside the model)",
            "dataset": info.dataset,
        }
        (temporary / "serving_info.json").write_text(json.dumps(serving_info, indent=2) + "\n")
        os.replace(temporary, export_dir)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return export_dir
