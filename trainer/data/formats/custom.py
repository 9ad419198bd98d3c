"""`dataset=custom`: your own part, any importable class (or function) named by `dataset._target_`.

    python run.py dataset=custom dataset._target_=my_package.MySource dataset.root=/data

It is called with `image_size`, `data_dir`, `name` and every key you add (`dataset.root=/data`), and its
`load(check_val)` returns `trainer.data.parts.Splits`, as the built-in formats' does; a dataclass of its keys
with a `load` method, like `trainer.data.formats.folder.ImageFolder`, is the simplest (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainer.data.formats.base import DatasetConfig


@dataclass
class CustomDatasetConfig(DatasetConfig):
    """`dataset=custom`: your own part (`dataset._target_=my_package.MySource`); its own keys go to `options`."""

    OPEN: ClassVar[str | None] = "options"

    name: str = "custom"  # the option's name
    data_dir: str = "."  # handed to the part like every key
    options: dict[str, Any] = field(default_factory=dict)  # the part's own keys (dataset.root=/data ...)
