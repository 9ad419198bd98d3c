"""Files a command writes outside its run folder: a prediction CSV never replaces anything else.

python run.py mode=predict checkpoint=RUN predict.input=photos/ predict.output=predictions.csv
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainer.errors import DataError


def check_writable(path: str | os.PathLike, key: str) -> None:
    """Fails early, naming the config key, when a file cannot be created beside `path`.

    Raises:
        DataError: the folder cannot be created or written.
    """
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise DataError(f"{key}={path}: cannot write there ({error.strerror or error})") from None


PREDICTION_HEADER = "id,file,predicted_index,predicted_class,"  # how every prediction CSV begins


def check_prediction_output(path: str | os.PathLike, key: str = "predict.output") -> None:
    """Fails before any prediction unless `path` is a new `.csv` file or an earlier prediction CSV:
    a checkpoint, a folder or any other file is never replaced.

    Raises:
        DataError: `path` is not a `.csv` name, is a folder, is some other file, or cannot be written.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{key}={path} is a folder; give a .csv file path (e.g. {path / 'predictions.csv'})")
    if path.suffix.lower() != ".csv":
        raise DataError(f"{key}={path}: predictions are written as CSV; give a path ending in .csv")
    if path.exists():
        try:
            with open(path, newline="") as handle:
                first = handle.readline(4096)
        except (OSError, UnicodeDecodeError):
            first = ""
        if not first.startswith(PREDICTION_HEADER):
            raise DataError(
                f"{key}={path} exists and is not a prediction CSV (its first line is not {PREDICTION_HEADER}...); "
                "it is left untouched: choose another path or remove it"
            )
    check_writable(path, key)
