"""The dataset formats: each one file holding its keys (the `dataset` section's schema), their checks and its part.

    python run.py dataset=folder dataset.data_dir=photos/      # trainer.data.formats.folder.ImageFolder

A format is a dataclass: its fields are the keys of `conf/dataset/<name>.yaml`, each written once with its
default and its meaning; `__post_init__` checks them when Hydra composes the config (`trainer.config.store`
registers each class as `/hydra/schema/dataset/<name>_schema`); and it is the dataset part itself, whose
`load(check_val)` returns `trainer.data.parts.Splits`. A format imports TensorFlow only inside `load`: the
command line composes and checks the config before TensorFlow starts. A new built-in format is one file here
and one YAML in `conf/dataset/`; your own (`dataset=custom`) follows the same protocol (docs/extending.md).
"""

from __future__ import annotations

import importlib
import pkgutil

BASE = "base"  # what every format shares: no format of its own


def schemas() -> dict[str, type]:
    """{`<name>_schema`: the format class} for each module `<name>` of this package, the one class it defines
    (`trainer.config.store` registers them): a new format is its file, and its YAML, and nothing else. An open
    format (`dataset=custom`, which takes any key) comes last: a saved section is typed by the first that takes it
    (`trainer.config.reuse`)."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name == BASE:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        (kind,) = [value for value in vars(module).values() if _is_format(value, module.__name__)]
        found[f"{module_info.name}_schema"] = kind
    return dict(sorted(found.items(), key=lambda item: item[1].OPEN is not None))


def _is_format(value: object, module: str) -> bool:
    from trainer.data.formats.base import DatasetConfig

    return isinstance(value, type) and issubclass(value, DatasetConfig) and value.__module__ == module
