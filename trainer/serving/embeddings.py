"""Embeddings: the features that enter the classifier's last layer, L2-normalised, for retrieval and near-duplicates.

    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.embeddings=true   # + `embed`
    python run.py mode=predict checkpoint=RUN predict.input=photos/ predict.embeddings=true   # embeddings.npy

The penultimate features are read by cloning the inference model with its layer named
`predictions` (VGG19's, the fine-tuned base's, and the name a custom model's classifier is
asked to take) replaced by an identity: the same layers and weights, one pass. Unit length
makes the dot product of two embeddings their cosine similarity.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np

from trainer.errors import ConfigError, DataError
from trainer.models.temperature import with_temperature
from trainer.runs.atomic import atomic_path

HEAD = "predictions"  # the classifier layer whose input the embeddings are


def _layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def _head(model: keras.Model, key: str) -> keras.layers.Layer:
    """The model's `predictions` layer, taking [batch, features]; else one line naming `key`."""
    found = [layer for layer in _layers(model) if layer.name == HEAD]
    if len(found) != 1:
        raise ConfigError(
            f"{key}=true reads the features entering the layer named '{HEAD}', and model '{model.name}' has "
            f"{'none' if not found else len(found)}: name the classifier layer of a custom model '{HEAD}'"
        )
    shape = found[0].input.shape
    if len(shape) != 2:
        raise ConfigError(
            f"{key}=true needs the input of layer '{HEAD}' to be a vector per image; in model '{model.name}' it "
            f"has shape {tuple(shape)}"
        )
    return found[0]


def _features(model: keras.Model, key: str) -> tuple[keras.Model, keras.layers.Layer]:
    """(uint8 images -> the unnormalised penultimate features, the `predictions` layer): one clone that shares
    every layer and weight of `model` but ends before its head."""
    head = _head(model, key)

    def up_to_head(layer: keras.layers.Layer) -> keras.layers.Layer:
        return keras.layers.Identity(name="features") if layer is head else layer

    features = keras.models.clone_model(model, clone_function=up_to_head, recursive=True)
    _require_last_step(model, features, head, key)
    return features, head


def embedding_model(model: keras.Model, key: str = "export.embeddings") -> keras.Model:
    """uint8 images -> float32 [batch, size] embeddings of unit length (the inference `model`'s penultimate
    features).

    Raises:
        ConfigError: naming `key`: the model has no single `predictions` layer taking a vector per image, or
            that layer is not its last step (its output and the model's differ on a test batch).
    """
    features, _ = _features(model, key)
    image = keras.Input(shape=model.input_shape[1:], dtype=model.inputs[0].dtype, name="image")
    normalised = keras.layers.UnitNormalization(dtype="float32", name="embeddings")(features(image))
    return keras.Model(image, normalised, name=f"{model.name}_embeddings")


def with_embeddings(
    model: keras.Model, temperature: float | None = None, key: str = "export.embeddings", names: bool = False
) -> keras.Model:
    """One pass, two outputs: [probabilities (with `temperature` baked in, as `with_temperature`), embeddings];
    a dict of the two with `names` (ONNX names its outputs by the keys).

    Raises:
        ConfigError: as `embedding_model`.
    """
    features, head = _features(model, key)
    image = keras.Input(shape=model.input_shape[1:], dtype=model.inputs[0].dtype, name="image")
    vector = features(image)
    vector_input = keras.Input(shape=tuple(head.input.shape[1:]), name="features")
    classifier = keras.Model(vector_input, head(vector_input), name=HEAD)  # the model's probabilities
    probabilities = with_temperature(classifier, temperature)(vector)
    embeddings = keras.layers.UnitNormalization(dtype="float32", name="embeddings")(vector)
    outputs = {"probabilities": probabilities, "embeddings": embeddings} if names else [probabilities, embeddings]
    return keras.Model(image, outputs, name=f"{model.name}_with_embeddings")


def _require_last_step(model: keras.Model, features: keras.Model, head: keras.layers.Layer, key: str) -> None:
    """`head` applied to the features gives the model's own probabilities (on two images of random pixels):
    else something follows the `predictions` layer, and its input is not the penultimate layer."""
    pixels = np.random.default_rng(0).integers(0, 256, (2, *model.input_shape[1:]), dtype=np.uint8)
    expected = np.asarray(model(pixels, training=False))
    got = np.asarray(head(features(pixels, training=False)))
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=0, atol=1e-5):
        raise ConfigError(f"{key}=true: layer '{HEAD}' is not the last step of model '{model.name}'")


NPY_MAGIC = b"\x93NUMPY"


def embeddings_file(csv: Path, key: str = "predict.embeddings") -> Path:
    """`embeddings.npy` beside the prediction CSV `csv`, checked before predicting: an earlier NumPy array there
    is replaced (as an earlier prediction CSV is), anything else is never touched.

    Raises:
        DataError: naming `key`: a folder or a file that is no NumPy array holds the name.
    """
    path = Path(csv).parent / "embeddings.npy"
    if path.is_dir() or (path.exists() and path.read_bytes()[: len(NPY_MAGIC)] != NPY_MAGIC):
        raise DataError(f"{key}=true writes {path}, which exists and is no NumPy array; it is left untouched")
    return path


class EmbeddingRows:
    """The embeddings of a prediction, one row per CSV row in its order: a skipped input's row is NaN."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.size = 0

    def add(self, outputs: list | None, skipped: list[bool]) -> np.ndarray | None:
        """`outputs` of a batch of the inputs not `skipped` (None: all skipped): keeps their embeddings, in
        order, with a NaN row for each skipped input. Returns the probabilities."""
        probabilities, vectors = (None, np.zeros((0, self.size))) if outputs is None else outputs
        vectors = np.asarray(vectors)
        self.size = self.size or vectors.shape[1]
        found = iter(vectors)
        self.rows += [None if gone else next(found) for gone in skipped]
        return probabilities

    def write(self, path: Path) -> None:
        blank = np.full(self.size, np.nan, np.float32)
        array = np.stack([blank if row is None else row for row in self.rows]) if self.rows else np.zeros((0, 0))
        with atomic_path(path) as temporary, open(temporary, "wb") as handle:
            np.save(handle, array.astype(np.float32))
