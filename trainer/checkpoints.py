"""Find and load a trained model: a `.keras` file, or a run folder (its `checkpoints/best.keras`).

Models load with Keras safe mode on, so a checkpoint cannot run arbitrary code.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00
"""

from __future__ import annotations

import os
from pathlib import Path

import keras

from trainer.errors import DataError

BEST = Path("checkpoints") / "best.keras"


def resolve(path: str | os.PathLike) -> Path:
    """The `.keras` file that `path` names.

    Raises:
        DataError: nothing is there, or the run folder holds no checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        best = path / BEST
        if not best.is_file():
            raise DataError(f"checkpoint={path}: the folder holds no {BEST} (is it a training run folder?)")
        return best
    if not path.is_file():
        raise DataError(f"checkpoint={path}: no such file or run folder")
    if path.suffix != ".keras":
        raise DataError(f"checkpoint={path}: expected a .keras file or a run folder")
    return path


def load(path: str | os.PathLike, num_classes: int, input_shape: tuple[int, ...] | None = None) -> keras.Model:
    """Loads a checkpoint (safe mode) and checks that it fits the data.

    Args:
        path: A `.keras` file or a run folder.
        num_classes: Classes of the dataset it will see.
        input_shape: (height, width, channels) the pipeline produces, checked when given.

    Raises:
        DataError: the file is missing or unreadable, or the model does not fit the data.
    """
    file = resolve(path)
    try:
        model = keras.saving.load_model(file, compile=False, safe_mode=True)
    except Exception as error:  # a truncated zip, an unknown layer, a foreign file
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"checkpoint={file}: cannot be loaded as a Keras model ({reason})") from None
    classes = model.output_shape[-1]
    if classes != num_classes:
        raise DataError(f"checkpoint={file} predicts {classes} classes but the dataset has num_classes={num_classes}")
    if input_shape is not None and tuple(model.input_shape[1:]) != tuple(input_shape):
        raise DataError(
            f"checkpoint={file} expects inputs of shape {tuple(model.input_shape[1:])} "
            f"but the dataset pipeline gives {tuple(input_shape)}"
        )
    return model
