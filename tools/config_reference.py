"""The config reference of the docs, generated from the schemas: every key, its type, default and meaning.

    python -m tools.config_reference > docs/reference/config.md     # the page, committed (tests/test_docs.py)

The meaning of a key is the comment on its line in `trainer/config/schema.py`, so the
reference cannot drift from the code: a key without a comment shows as such.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import io
import tokenize
from typing import Any

from trainer.config import groups, schema
from trainer.config.store import SCHEMAS

SECTIONS = {  # sections with one schema; the groups (dataset, model, optimizer, strategy) list each option's
    "trainer": schema.TrainerConfig,
    "objective": schema.ObjectiveConfig,
    "callbacks": schema.CallbacksConfig,
    "logger": schema.LoggerConfig,
    "evaluate": schema.EvaluateConfig,
    "predict": schema.PredictConfig,
    "inspect": schema.InspectConfig,
    "export": schema.ExportConfig,
    "finetune": schema.FinetuneConfig,
}
NESTED = {  # (section, field) -> the schema of a nested node, listed as its own table
    ("dataset", "augment"): ("dataset.augment", "Augmentation"),
    ("optimizer", "schedule"): ("optimizer.schedule", "ScheduleConfig"),
    ("callbacks", "early_stopping"): ("callbacks.early_stopping", "EarlyStoppingConfig"),
    ("callbacks", "reduce_lr_on_plateau"): ("callbacks.reduce_lr_on_plateau", "ReduceLROnPlateauConfig"),
    ("logger", "tensorboard"): ("logger.tensorboard", "TensorBoardConfig"),
    ("logger", "mlflow"): ("logger.mlflow", "MLflowConfig"),
    ("logger", "wandb"): ("logger.wandb", "WandbConfig"),
}


def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment on its line} for a dataclass and the classes it inherits from (a subclass's own
    comment wins)."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = inspect.getsource(klass)
        names = {item.name for item in dataclasses.fields(klass)}
        line_field: dict[int, str] = {}
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
                line_field.setdefault(token.start[0], token.string)
            elif token.type == tokenize.COMMENT and token.start[0] in line_field:
                comments[line_field[token.start[0]]] = token.string.lstrip("# ").strip()
    return comments


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.replace("typing.", "").replace("trainer.config.schema.", "")


def _default(item: dataclasses.Field) -> str:
    if item.default is not dataclasses.MISSING:
        value = item.default
    elif item.default_factory is not dataclasses.MISSING:
        value = item.default_factory()
    else:
        return ""
    if dataclasses.is_dataclass(value):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    if value == "???":
        return "required"
    return f"`{_yaml(value)}`"


def _yaml(value: Any) -> str:
    """A default as it reads in YAML: null, true, [a, b], {}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml(item)}" for key, item in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    """A table cell's text as Markdown shows it: `|` escaped, and outside code spans `<launch folder>` not taken
    for an HTML tag."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[index] = parts[index].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def table(cls: type, prefix: str) -> list[str]:
    """A Markdown table of `cls`'s keys under `prefix` (nested sections get their own table)."""
    comments = field_comments(cls)
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for item in dataclasses.fields(cls):
        kind = _type_name(item.type)
        key = f"`{prefix}.{item.name}`" if prefix else f"`{item.name}`"
        meaning = comments.get(item.name, "")
        lines.append(f"| {key} | {_cell(kind)} | {_cell(_default(item))} | {_cell(meaning)} |")
    return lines


def _section(title: str, cls: type, prefix: str, note: str = "") -> list[str]:
    lines = [f"### {title}", ""]
    doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    if doc and not doc.startswith(cls.__name__ + "("):
        lines += [doc, ""]
    if note:
        lines += [note, ""]
    lines += [*table(cls, prefix), ""]
    for item in dataclasses.fields(cls):
        nested = NESTED.get((prefix.split(".")[0], item.name))
        if nested:
            lines += _section(f"`{nested[0]}`", _schema_class(nested[1]), nested[0])
    return lines


def _schema_class(name: str) -> type:
    """A schema class by name, from whichever module of the config (or the augmentation config) defines it."""
    from trainer.data import augmentation

    for module in (schema, groups, augmentation):
        if hasattr(module, name):
            return getattr(module, name)
    raise KeyError(name)


def markdown() -> str:
    """The whole reference, group options first, then the other sections and the top-level keys."""
    lines = [
        "Generated from the typed schemas in `trainer/config/schema.py` (`python -m tools.config_reference`).",
        "Every key can be set on the command line (`python run.py trainer.epochs=5`) or in a YAML file of `conf/`;",
        "a typo, a wrong type or an out-of-range value stops the run at start-up with the key's name.",
        "",
    ]
    for group, options in SCHEMAS.items():
        lines += [f"## `{group}=`", ""]
        for name, cls in options.items():
            option = name.removesuffix("_schema")
            note = f"Schema of `{group}` options built on `{name}` (e.g. `conf/{group}/*.yaml`)."
            lines += _section(f"{cls.__name__} (`{option}`)", cls, group, note)
    lines += ["## Other sections", ""]
    for section, cls in SECTIONS.items():
        lines += _section(f"`{section}`", cls, section)
    top = [item for item in dataclasses.fields(schema.Config) if item.name not in (*SCHEMAS, *SECTIONS)]
    comments = field_comments(schema.Config)
    lines += ["## Top-level keys", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for item in top:
        meaning = comments.get(item.name, "")
        lines.append(f"| `{item.name}` | {_cell(_type_name(item.type))} | {_cell(_default(item))} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def page() -> str:
    """docs/reference/config.md as committed: readable on GitHub and in an editor, and built into the manual."""
    return "# Config keys\n\n" + markdown()


if __name__ == "__main__":
    print(page(), end="")
