"""Export a trained model for serving: a SavedModel that takes uint8 images of any size.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/cats_dogs

The folder is laid out for TensorFlow Serving: `EXPORT_DIR/1/` holds the
SavedModel (version 1), `EXPORT_DIR/serving_info.json` the class names and
input spec. Resizing and the model's normalization run inside the graph, so
a client sends raw pixels and needs none of this project's code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from trainer.data.augment import normalize
from trainer.errors import DataError

VERSION = "1"


def serving_function(model: keras.Model, image_size: int, normalization: str):
    """uint8 [batch, height, width, 3] of any size -> {"probabilities": [batch, classes]}."""

    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        pixels = tf.image.resize(tf.cast(images, tf.float32), [image_size, image_size], antialias=True)
        return {"probabilities": model(normalize(pixels, normalization), training=False)}

    return serve


def export_serving(
    model: keras.Model, export_dir: str | os.PathLike, image_size: int, normalization: str, class_names: list[str]
) -> Path:
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
            fn=serving_function(model, image_size, normalization),
            input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
        )
        archive.write_out(str(temporary / VERSION), verbose=False)
        info = {
            "class_names": class_names,
            "signature": "serve",
            "input": {
                "name": "images",
                "dtype": "uint8",
                "shape": [None, None, None, 3],
                "note": "RGB pixels of any size; resized to the model input inside the graph",
            },
            "output": {"name": "probabilities", "dtype": "float32", "shape": [None, len(class_names)]},
            "image_size": image_size,
            "normalization": normalization,
        }
        (temporary / "serving_info.json").write_text(json.dumps(info, indent=2) + "\n")
        os.replace(temporary, export_dir)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return export_dir
