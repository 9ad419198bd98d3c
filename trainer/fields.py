"""What every schema uses: enum-like choices and the range checks that name the key.

    python run.py trainer.precision=float64   # -> refused when Hydra composes: expected one of [float32, ...]

It sits beside `trainer.errors`, below every layer, so the dataset formats' schemas in `trainer.data.formats` use it
as the config's do.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from trainer.errors import ConfigError

MISSING = "???"  # a key without a default, which the config must set (the config library's own marker)


class Choice(str, Enum):
    """An enum-like option: OmegaConf rejects any other value when Hydra composes the config, naming
    the key and the valid choices. Members compare, hash and print as their plain strings."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def _missing_(cls, value: Any) -> Choice | None:
        """An integer option's number (`trainer.verbose: 0` in YAML) is its member of that name ("0")."""
        if isinstance(value, int) and not isinstance(value, bool):
            return cls.__members__.get(str(value))
        return None


def choice(name: str, *values: str) -> type[Choice]:
    return Choice(name, {value: value for value in values})


def chosen(kind: type[Choice], value: Any, key: str) -> Choice:
    """`value` (its lower-case text: a boolean is `true` or `false`) as a member of `kind`.

    Raises:
        ConfigError: `KEY must be one of A, B, C; got VALUE`, as Hydra's composition says it for a typed choice.
    """
    text = str(value).lower()
    if text not in kind.__members__:
        raise ConfigError(f"{key} must be one of {', '.join(kind.__members__)}; got {text!r}")
    return kind[text]


def require(condition: bool, key: str, expected: str, value: Any) -> None:
    """Raises `ConfigError("KEY must be EXPECTED; got VALUE")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{key} must be {expected}; got {value!r}")


def file_list(value: Any, key: str) -> list[str]:
    """A list of paths or globs from a list or from one string (`dataset.train_files=/data/x_*`)."""
    files = [value] if isinstance(value, str) else list(value or [])
    require(bool(files) and all(isinstance(f, str) and f for f in files), key, "a glob or a non-empty list", value)
    return files


_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def duration_seconds(value: Any, key: str) -> float | None:
    """Seconds from `2h30m`, `90m`, `45s`, `1d`, or a plain number of seconds; None stays None.

    Raises:
        ConfigError: naming `key`, for anything else or a duration that is not positive.
    """
    if value is None:
        return None
    text = str(value).strip().lower().replace(" ", "")
    parts = re.fullmatch(r"((\d+(\.\d+)?)[dhms])+|\d+(\.\d+)?", text)
    if parts is None:
        raise ConfigError(f"{key} must be a duration such as 2h30m, 90m, 45s or seconds; got {value!r}")
    if text[-1].isdigit():
        seconds = float(text)
    else:
        seconds = sum(float(number) * _UNITS[unit] for number, unit in re.findall(r"(\d+(?:\.\d+)?)([dhms])", text))
    require(seconds > 0, key, "> 0", value)
    return seconds


PRUNE_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")  # what fit logs each epoch


def check_prune_metric(prune_metric: str | None, mode: Any) -> None:
    """`objective.prune_metric` against `objective.mode`: the pruner compares it in the study's direction, so a loss
    goes with min and an accuracy with max (None: the objective's metric, checked as the objective).

    Raises:
        ConfigError: the key, the names that fit the mode, and the value.
    """
    if prune_metric is None:
        return
    minimized = str(getattr(mode, "value", mode)) == "min"
    fitting = [name for name in PRUNE_METRICS if ("loss" in name) == minimized]
    expected = f"one of {fitting} with objective.mode={'min' if minimized else 'max'} (the pruner compares it in the "
    require(prune_metric in fitting, "objective.prune_metric", expected + "study's direction)", prune_metric)
