"""What every schema module uses: enum-like choices and the range checks that name the key.

python run.py trainer.precision=float64   # -> refused when Hydra composes: expected one of [float32, ...]
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from trainer.errors import ConfigError


class Choice(str, Enum):
    """An enum-like option: OmegaConf rejects any other value when Hydra composes the config, naming
    the key and the valid choices. Members compare, hash and print as their plain strings."""

    __str__ = str.__str__
    __format__ = str.__format__


def choice(name: str, *values: str) -> type[Choice]:
    return Choice(name, {value: value for value in values})


ValSource = choice("ValSource", "train", "test")
TFRecordFormat = choice("TFRecordFormat", "raw", "jpeg")
ResizeMode = choice("ResizeMode", "resize", "crop", "pad")  # trainer.data.decode.RESIZE_MODES
ScheduleName = choice("ScheduleName", "constant", "step", "cosine")
Precision = choice("Precision", "float32", "mixed_float16", "mixed_bfloat16")
Direction = choice("Direction", "max", "min")
EvaluateSplit = choice("EvaluateSplit", "val", "test")
Split = choice("Split", "train", "val", "test")
WandbMode = choice("WandbMode", "offline", "online", "disabled")
Mode = choice("Mode", "train", "evaluate", "predict", "inspect", "export")
ExportFormat = choice("ExportFormat", "saved_model", "onnx", "litert", "all")
Quantize = choice("Quantize", "none", "float16", "int8")


def require(condition: bool, key: str, expected: str, value: Any) -> None:
    """Raises `ConfigError("KEY must be EXPECTED; got VALUE")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key} must be {expected}; got {value!r}")


def file_list(value: Any, key: str) -> list[str]:
    """A list of paths or globs from a list or from one string (`dataset.train_files=/data/x_*`)."""
    files = [value] if isinstance(value, str) else list(value or [])
    require(bool(files) and all(isinstance(f, str) and f for f in files), key, "a glob or a non-empty list", value)
    return files
