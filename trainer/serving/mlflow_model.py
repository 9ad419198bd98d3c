"""The run's best checkpoint as an MLflow Model that takes images as MLflow clients send them.

    python run.py logger=mlflow                        # logs RUN/checkpoints/best.keras as runs:/RUN_ID/model
    mlflow models serve -m runs:/RUN_ID/model --env-manager local -h 127.0.0.1 -p 5001
    curl 127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
        -d '{"dataframe_records": [{"image_bytes": "'$(base64 -w0 cat.jpg)'"}]}'

The signature names two optional columns, one of which each row gives:
- `image_bytes`: a base64 JPEG, PNG, GIF (its first frame), BMP or WebP file, decoded as the exported
  `serve_bytes` decodes it (and as training did);
- `images`: uint8 pixels [height, width, 3] of any size, resized as the exported `serve` resizes them.

Every request form that names its input works (`dataframe_split`, `dataframe_records`, `instances` and
`inputs` with named columns); an empty batch that names its column gets an empty answer. MLflow drops every
column its signature does not name (`image`, an unnamed `inputs` list) before `predict` sees the request, so a
request left with neither column is refused, not answered with nothing. Each row of the answer has
`predicted_index`, `predicted_class`, `probability` and `probabilities` (in the order of the metadata's
`class_names`).
"""

from __future__ import annotations

import base64
import binascii
import importlib.metadata
import logging
import os
import re
from pathlib import Path
from typing import Any

import keras
import mlflow
import numpy as np
import pandas as pd
import tensorflow as tf
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types.schema import AnyType, Array, ColSpec, DataType, Schema

from trainer.data.decode import MAX_PIXELS
from trainer.errors import one_line
from trainer.runs import checkpoints
from trainer.serving.saved_model import bytes_function, serving_function

PIXELS, ENCODED = "images", "image_bytes"
PACKAGE = Path(__file__).resolve().parents[1]  # trainer/: the logged model's code
OUTPUTS = ("predicted_index", "predicted_class", "probability", "probabilities")
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec(AnyType(), PIXELS, required=False), ColSpec(DataType.string, ENCODED, required=False)]),
    outputs=Schema(
        [
            ColSpec(DataType.long, "predicted_index"),
            ColSpec(DataType.string, "predicted_class"),
            ColSpec(DataType.double, "probability"),
            ColSpec(Array(DataType.double), "probabilities"),
        ]
    ),
)


NO_COLUMN = (
    f"the request gives neither column {ENCODED!r} (a base64 file) nor {PIXELS!r} (uint8 pixels [height, width, "
    f"3]); MLflow drops any other column (such as 'image') and an unnamed 'inputs' or 'instances' list: name the "
    f'column, e.g. {{"dataframe_records": [{{"{ENCODED}": "..."}}]}}, in an empty batch too'
)


def _bad_request(message: str) -> MlflowException:
    return MlflowException.invalid_parameter_value(message)  # `mlflow models serve` answers 400 with it


class ImageClassifier(mlflow.pyfunc.PythonModel):
    """The pyfunc model: the checkpoint's inference model behind the export's two serving functions."""

    def load_context(self, context) -> None:
        model, info = checkpoints.load(Path(context.artifacts["checkpoint"]))
        self.class_names = list(info.class_names)
        self._serve = tf.function(
            serving_function(model, info), input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)]
        )
        self._serve_bytes = tf.function(
            bytes_function(model, info, MAX_PIXELS), input_signature=[tf.TensorSpec([None], tf.string)]
        )

    # `model_input` is typed with one of the types MLflow infers no schema from (SIGNATURE is the schema): with no
    # type hint MLflow warned, in colour, on every import of this module (training with logger=mlflow, the watcher,
    # `mlflow models serve`), and under its own "once" filter, which a caller's warning filter cannot override.
    def predict(self, context, model_input: pd.DataFrame, params=None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if PIXELS not in frame and ENCODED not in frame:  # what MLflow leaves of `image` or an unnamed list
            raise _bad_request(NO_COLUMN)
        pixels, encoded = _column(frame, PIXELS), _column(frame, ENCODED)
        pixel_rows, file_rows = _rows_of_each_form(pixels, encoded)
        probabilities = np.zeros((len(frame), len(self.class_names)), np.float32)
        if file_rows:
            files = tf.constant([_decode_base64(encoded.iloc[row], row) for row in file_rows], tf.string)
            probabilities[file_rows] = self._call(self._serve_bytes, files, file_rows)
        for rows in _by_shape(pixels, pixel_rows).values():
            batch = np.stack([_image(pixels.iloc[row], row) for row in rows])
            probabilities[rows] = self._call(self._serve, tf.constant(batch), rows)
        return _answer(probabilities, self.class_names)

    @staticmethod
    def _call(function, batch: tf.Tensor, rows: list[int]) -> np.ndarray:
        try:
            return function(batch)["probabilities"].numpy()
        except tf.errors.InvalidArgumentError as error:  # serve_bytes names a string by its index in `batch`
            reason = re.sub(
                r"image_bytes\[(\d+)\]", lambda found: f"row {rows[int(found[1])]}: {ENCODED!r}", one_line(error)
            )
            raise _bad_request(reason) from None


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series([None] * len(frame), dtype=object)


def _rows_of_each_form(pixels: pd.Series, encoded: pd.Series) -> tuple[list[int], list[int]]:
    """(rows that give pixels, rows that give a file); a row that gives both or neither is a bad request."""
    pixel_rows, file_rows = [], []
    for row, (image, text) in enumerate(zip(pixels, encoded, strict=True)):
        if _given(image) == _given(text):
            raise _bad_request(f"row {row}: give one of the columns {PIXELS!r} (uint8 pixels) or {ENCODED!r}")
        (pixel_rows if _given(image) else file_rows).append(row)
    return pixel_rows, file_rows


def _answer(probabilities: np.ndarray, class_names: list[str]) -> pd.DataFrame:
    best = probabilities.argmax(axis=1)
    return pd.DataFrame(
        {
            "predicted_index": best.astype(np.int64),
            "predicted_class": [class_names[index] for index in best],
            "probability": probabilities[np.arange(len(best)), best].astype(np.float64),
            "probabilities": [row.astype(np.float64).tolist() for row in probabilities],
        },
        columns=list(OUTPUTS),
    )


def _given(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float):
        return not np.isnan(value)  # pandas fills a row's missing column with NaN
    return True


def _decode_base64(text: Any, row: int) -> bytes:
    if not isinstance(text, str):
        raise _bad_request(f"row {row}: {ENCODED!r} must be a base64 string; got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad_request(f"row {row}: {ENCODED!r} is not base64") from None


def _image(value: Any, row: int) -> np.ndarray:
    image = np.asarray(value)
    if image.ndim != 3 or image.shape[-1] != 3 or not np.issubdtype(image.dtype, np.number):
        raise _bad_request(f"row {row}: {PIXELS!r} must be pixels [height, width, 3]; got shape {image.shape}")
    if image.size and (image.min() < 0 or image.max() > 255):
        raise _bad_request(f"row {row}: {PIXELS!r} must hold values 0-255; got {image.min()}-{image.max()}")
    if image.size and not np.issubdtype(image.dtype, np.integer) and np.any(image != np.round(image)):
        raise _bad_request(  # floats in [0, 1] would be read as a black image
            f"row {row}: {PIXELS!r} must hold whole numbers 0-255 (uint8 pixels); got fractions in "
            f"{image.min():g}-{image.max():g} (scale [0, 1] floats by 255 and round them)"
        )
    return image.astype(np.uint8)


def _by_shape(pixels: pd.Series, rows: list[int]) -> dict[tuple[int, ...], list[int]]:
    """The rows of `pixels`, grouped by image shape: one call of `serve` per size."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in rows:
        groups.setdefault(np.shape(pixels.iloc[row]), []).append(row)
    return groups


def _blank_png(side: int) -> str:
    """A black `side` x `side` PNG, base64: the logged model's example request."""
    png = tf.io.encode_png(tf.zeros([side, side, 3], tf.uint8)).numpy()
    return base64.b64encode(png).decode()


def _requirements() -> list[str]:
    """The pins of vggtrain's own dependencies as installed here: the serving environment MLflow builds (outside
    an installed vggtrain, e.g. a checkout on PYTHONPATH: TensorFlow and Keras, which the model needs)."""
    try:
        declared = importlib.metadata.requires("vggtrain") or []
    except importlib.metadata.PackageNotFoundError:
        declared = ["tensorflow", "keras"]
    pins = [f"mlflow=={mlflow.__version__}"]
    for requirement in declared:
        if "extra ==" in requirement:
            continue
        name = re.split(r"[\s;\[<>=!~]", requirement.strip(), maxsplit=1)[0]
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    return pins


PROGRESS_BARS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def log_model(uri: str, run_id: str, checkpoint: Path, register_as: str | None = None) -> str:
    """Logs `checkpoint` (its inference model) as the MLflow Model `model` of the run `run_id`, with this
    package as its code, the class names and image size as metadata; registered as `register_as` when given.
    Returns the model's URI."""
    info = checkpoints.read_info(checkpoint)
    if info is None:
        raise ValueError(f"{checkpoint} holds no vggtrain.json")  # a checkpoint this run wrote always does
    # The fluent API below reads MLflow's global URI. set_tracking_uri sets MLFLOW_TRACKING_URI too, so both go
    # back as they were: "restored" to get_tracking_uri()'s default, the variable named <cwd>/mlflow.db, which
    # the next run of this process (a sweep's job) took for the user's choice of store.
    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    interactive = keras.config.is_interactive_logging_enabled()
    keras.config.disable_interactive_logging()  # no Keras progress bar while MLflow loads the model back
    pyfunc_log = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_log.level
    pyfunc_log.setLevel(logging.ERROR)  # its advice on pickling, its check of the input example
    # MLflow's own switch for the tqdm bars ("Uploading artifacts", "Downloading artifacts" as it loads the model
    # back to check the input example) that reached the run's log; a value the user set is kept.
    bars = os.environ.get(PROGRESS_BARS)
    os.environ[PROGRESS_BARS] = bars if bars is not None else "false"
    try:
        with mlflow.start_run(run_id=run_id):
            logged = mlflow.pyfunc.log_model(
                name="model",
                python_model=ImageClassifier(),
                artifacts={"checkpoint": str(checkpoint)},
                code_paths=[str(PACKAGE)],  # the serving side needs no install of vggtrain
                signature=SIGNATURE,
                input_example=pd.DataFrame({ENCODED: [_blank_png(info.image_size)]}),  # MLflow serves it once
                registered_model_name=register_as,
                pip_requirements=_requirements(),
                metadata={"class_names": list(info.class_names), "image_size": info.image_size},
            )
    finally:
        mlflow.set_tracking_uri(previous)  # None: unset again, as MLflow's own _use_tracking_uri does
        pyfunc_log.setLevel(level)
        if bars is None:
            os.environ.pop(PROGRESS_BARS, None)
        if interactive:
            keras.config.enable_interactive_logging()
    return logged.model_uri
