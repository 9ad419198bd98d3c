"""The SavedModel for TensorFlow Serving: `serve` takes uint8 pixels of any size, `serve_bytes` encoded images.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/cats_dogs
    docker run -p 8501:8501 -v $PWD/serving/cats_dogs:/models/cats_dogs -e MODEL_NAME=cats_dogs tensorflow/serving
    curl -d '{"signature_name": "serve_bytes", "instances": [{"b64": "'$(base64 -w0 cat.jpg)'"}]}' \\
        localhost:8501/v1/models/cats_dogs:predict

Both signatures resize (and centre-crop) as the model was evaluated; the normalization is the model's
own layers, so training and serving cannot drift apart, and a client needs none of this project's code.
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from trainer.data.decode import MAX_PIXELS, decode_images
from trainer.data.headers import image_format
from trainer.data.preprocess import Preprocess, prepare_images
from trainer.runs.checkpoints import ModelInfo

VERSION = "1"  # TensorFlow Serving's version folder


def _probabilities(model: keras.Model, images: tf.Tensor, name: str = "probabilities") -> dict[str, tf.Tensor]:
    """The model's output, float32 [batch, classes] (or [batch, size] of an embedding model); an empty batch
    gets an empty answer (the model's layers are not all defined on zero images)."""
    classes = model.output_shape[-1]
    probabilities = tf.cond(
        tf.shape(images)[0] > 0,
        lambda: tf.cast(model(images, training=False), tf.float32),
        lambda: tf.zeros([0, classes], tf.float32),
    )
    return {name: tf.ensure_shape(probabilities, [None, classes])}


def serving_function(model: keras.Model, info: ModelInfo):
    """uint8 [batch, height, width, 3] of any size -> {"probabilities": [batch, classes]}: the evaluation
    resize and centre crop, then the model (which normalizes)."""
    preprocess = Preprocess.for_evaluation(info.resize_to, info.image_size)

    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        return _probabilities(model, prepare_images(images, preprocess))

    return serve


def embed_function(embedder: keras.Model, info: ModelInfo):
    """uint8 [batch, height, width, 3] of any size -> {"embeddings": [batch, size]}: `serve`'s resize and
    centre crop, then `embedder` (`trainer.serving.embeddings.embedding_model`: unit-length features)."""
    preprocess = Preprocess.for_evaluation(info.resize_to, info.image_size)

    def embed(images: tf.Tensor) -> dict[str, tf.Tensor]:
        return _probabilities(embedder, prepare_images(images, preprocess), "embeddings")

    return embed


def bytes_function(model: keras.Model, info: ModelInfo, max_pixels: int = MAX_PIXELS):
    """string [batch] of encoded JPEG, PNG, GIF (the first frame), BMP or WebP images -> {"probabilities"}:
    the pixels of `bytes_pixels`, then the model."""
    pixels = bytes_pixels(info, max_pixels)

    def serve_bytes(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        return _probabilities(model, pixels(image_bytes))

    return serve_bytes


def bytes_pixels(info: ModelInfo, max_pixels: int = MAX_PIXELS):
    """string [batch] of encoded images -> the uint8 pixels `serve_bytes` hands the model: each decoded as
    training and `mode=predict` decode it (`trainer.data.decode.decode_images`: the accurate DCT, the EXIF
    orientation, the model's resize mode and resize), then centre-cropped as `serve` does. A string that is
    no image fails the call with its index in the batch."""
    preprocess = Preprocess.for_evaluation(info.resize_to, info.image_size)

    def pixels(image_bytes: tf.Tensor) -> tf.Tensor:
        kinds = image_format(image_bytes)
        first_bad = tf.argmin(tf.concat([kinds, [0]], 0))  # -1 (no image) sorts first; an empty batch passes
        message = tf.strings.format("image_bytes[{}] is not a JPEG, PNG, GIF, BMP or WebP image", first_bad)
        with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(kinds >= 0), [message])]):
            images = decode_images(image_bytes, preprocess.image_size, info.resize_mode, max_pixels, name="image_bytes")
        return prepare_images(images, preprocess)

    return pixels


SIGNATURES = {
    "serve": {"name": "images", "dtype": "uint8", "shape": [None, None, None, 3]},
    "serve_bytes": {"name": "image_bytes", "dtype": "string", "shape": [None]},
}
EMBED = {"name": "images", "dtype": "uint8", "shape": [None, None, None, 3]}  # export.embeddings: `embed`


def write_saved_model(
    model: keras.Model,
    folder: Path,
    info: ModelInfo,
    max_pixels: int = MAX_PIXELS,
    embedder: keras.Model | None = None,
) -> Path:
    """Writes `folder/1/` with the `serve` (the default) and `serve_bytes` signatures, and `embed` with an
    `embedder`. Returns `folder/1`."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=serving_function(model, info),
        input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
    )
    archive.add_endpoint(
        name="serve_bytes",
        fn=bytes_function(model, info, max_pixels),
        input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    if embedder is not None:
        archive.track(embedder)
        archive.add_endpoint(
            name="embed",
            fn=embed_function(embedder, info),
            input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
        )
    archive.write_out(str(folder / VERSION), verbose=False)
    return folder / VERSION
