"""A run folder is the source of truth: reuse its composed config, with what you type now on top.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00                 # the run's own dataset
    python run.py mode=evaluate checkpoint=RUN dataset.data_dir=/other/copy evaluate.split=val

Hydra saves every run's composed config as `RUN/.hydra/config.yaml`. A later
command that names the run (`checkpoint=RUN`) starts from that file, so the
dataset, its files, image size, class names and model settings are the run's,
not whatever today's defaults say. The keys that describe this invocation
(`mode`, `checkpoint`, `evaluate`, `predict`, ..., the strategy) come from the
command line, and so does every key you override: what you type wins, key by key.

A relative `dataset.data_dir` in the saved config is the one the run was launched with:
it is anchored to the folder the run was launched from (`RUN/.hydra/hydra.yaml`'s
`hydra.runtime.cwd`), not to today's folder, where the same name may be other data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainer.config import legacy, schema
from trainer.config.schema import Config
from trainer.config.store import SCHEMAS, open_node
from trainer.errors import ConfigError

log = logging.getLogger(__name__)
SAVED_CONFIG = Path(".hydra") / "config.yaml"
# Keys that belong to this invocation, not to the run it reads: taken from the command line.
INVOCATION_KEYS = (
    "mode",
    "checkpoint",
    "resume",
    "output_dir",
    "evaluate",
    "predict",
    "export",
    "inspect",
    "strategy",
    "trainer.threads",
    "trainer.verbose",
)


REUSING_MODES = ("evaluate", "predict", "export", "inspect")  # modes that read `checkpoint=RUN`'s saved config
REUSED_GROUPS = ("dataset", "model", "optimizer")  # the run's own sections (the strategy is this invocation's)


def run_folder_of(checkpoint: str | None) -> Path | None:
    """The training run folder `checkpoint` names or lies in (`RUN` or `RUN/checkpoints/x.keras`), if it has
    a saved config; None for a bare `.keras` file."""
    if not checkpoint:
        return None
    path = Path(checkpoint)
    candidates = [path] if path.is_dir() else [path.parent.parent] if path.suffix == ".keras" else []
    return next((folder for folder in candidates if (folder / SAVED_CONFIG).is_file()), None)


def _schema_name(schema_class: type) -> str | None:
    default = getattr(schema_class, "name", None)
    return default if isinstance(default, str) else None


def _typed_group(group: str, node: DictConfig, source: Path) -> DictConfig:
    """`node` under its group's schema: the one whose `name` it has, else the first that accepts every key
    (unknown keys are errors; a model or dataset part with its own keys and `_target_` fits `custom`'s open
    schema)."""
    schemas = list(SCHEMAS[group].values())
    named = [candidate for candidate in schemas if _schema_name(candidate) == node.get("name")]
    errors = []
    for candidate in named or schemas:
        is_open = bool(getattr(candidate, "OPEN", None))
        if is_open and "_target_" not in node:
            continue  # an open schema takes any key: only a section that names its own part is one of its own
        base = open_node(candidate) if is_open else OmegaConf.structured(candidate)
        try:
            return OmegaConf.merge(base, node)
        except Exception as error:  # OmegaConf's validation errors have no common public base
            errors.append(str(error).splitlines()[0])
    raise ConfigError(f"{source}: its `{group}` section fits no {group} schema of this version ({'; '.join(errors)})")


def load_saved(run_dir: Path) -> DictConfig:
    """The typed config a run was composed with.

    Raises:
        ConfigError: the file is unreadable or does not fit this version's schemas.
    """
    source = run_dir / SAVED_CONFIG
    try:
        saved = OmegaConf.load(source)
    except Exception as error:  # YAML syntax, a truncated file
        raise ConfigError(f"{source}: not a readable config ({str(error).splitlines()[0]})") from None
    typed = OmegaConf.structured(Config)
    typed.callbacks = open_node(schema.CallbacksConfig)
    raw = legacy.upgrade(OmegaConf.to_container(saved, resolve=False))  # interpolations stay as written
    for key, value in raw.items():
        try:
            if key in SCHEMAS:
                typed[key] = _typed_group(key, OmegaConf.create(value), source)
            else:
                typed = OmegaConf.merge(typed, {key: value})
        except ConfigError:
            raise
        except Exception as error:
            reason = str(error).splitlines()[0]
            raise ConfigError(f"{source}: key `{key}` does not fit this version ({reason})") from None
    return typed


def override_keys(overrides: Iterable[str]) -> list[str]:
    """The config keys (or group names) a command line's Hydra overrides set; `hydra.*` left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [item.key_or_group for item in parsed if not item.key_or_group.startswith("hydra.")]


_ABSENT = object()


def _saved_choices(run_dir: Path) -> dict:
    """The config-group options a run was composed with (`RUN/.hydra/hydra.yaml`), {} if unknown."""
    try:
        return dict(OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra.runtime.choices)
    except Exception:  # no such file (a run folder made by hand), or an unreadable one: compare with nothing
        return {}


def _same_options(overrides: Sequence[str], run_dir: Path) -> set[str]:
    """The groups the command line sets to the option the run was made with (`dataset=folder` for a folder run):
    the run's section stays as saved (its `data_dir` too), and only the keys typed under it change."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = _saved_choices(run_dir)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return {
        item.key_or_group
        for item in parsed
        if item.key_or_group in REUSED_GROUPS and not item.is_delete()
        and choices.get(item.key_or_group) == item.get_value_element_as_str()
    }  # fmt: skip


def with_run_options(arguments: list[str]) -> list[str]:
    """`arguments` with the option the named run was made with of each group whose keys they set without naming
    one: `mode=evaluate checkpoint=RUN dataset.val_fraction=0.3` composes RUN's `dataset=folder`, whose keys
    those are, not today's default dataset, which would refuse the key as none of its own."""
    given = dict(argument.lstrip("+~").split("=", 1) for argument in arguments if "=" in argument)
    named = given.get("resume") or (given.get("checkpoint") if given.get("mode") in REUSING_MODES else None)
    run_dir = run_folder_of(named) if named and "://" not in named else None
    if run_dir is None:
        return arguments
    choices, keys = _saved_choices(run_dir), list(given)
    added = [
        f"{group}={choices[group]}"
        for group in REUSED_GROUPS
        if group not in given and choices.get(group) and any(key.startswith(group + ".") for key in keys)
    ]
    return [*added, *arguments]


def _launch_folder(run_dir: Path) -> Path | None:
    """The folder the run was launched from (`RUN/.hydra/hydra.yaml`'s `hydra.runtime.cwd`), None if unknown."""
    try:
        cwd = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra.runtime.cwd
    except Exception:  # no such file (a run folder made by hand), or an unreadable one
        return None
    return Path(cwd) if cwd else None


def _anchor_data_dir(merged: DictConfig, run_dir: Path, typed_keys: Sequence[str]) -> None:
    """A relative `dataset.data_dir` of the saved config, made absolute against the folder the run was launched
    from: read from another folder, the same relative name is other data (or none), a silent wrong answer. A
    data_dir typed now is the user's, relative to today's folder.
    """
    if any(key in ("dataset", "dataset.data_dir") for key in typed_keys):
        return
    data_dir = OmegaConf.select(merged, "dataset.data_dir", default=None, throw_on_missing=False)
    if not isinstance(data_dir, str) or not data_dir or "${" in data_dir or "://" in data_dir:
        return
    launched = _launch_folder(run_dir)
    if os.path.isabs(os.path.expanduser(data_dir)) or launched is None or launched == Path.cwd():
        return
    anchored, here = launched / data_dir, Path.cwd() / data_dir
    if not anchored.exists() and here.exists():
        log.warning(
            "%s was trained on dataset.data_dir=%s, relative to %s: %s is gone, so %s of this folder is read; "
            "give dataset.data_dir= if that is other data", run_dir, data_dir, launched, anchored, here,
        )  # fmt: skip
        return
    OmegaConf.update(merged, "dataset.data_dir", str(anchored), merge=False)
    log.info(
        "dataset.data_dir=%s of %s is relative to the folder it was launched from: %s <dataset.data_dir>",
        data_dir,
        run_dir,
        anchored,
    )


def _check_presets(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> None:
    """Presets of the global package (`experiment=`, `debug=`) have no key of their own to lay over the
    run's saved config: the same choice the run was made with is fine (a repeated command), another is an
    error, never silently ignored.

    Raises:
        ConfigError: a preset differs from the run's; names both choices.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = _saved_choices(run_dir)
    for item in OverridesParser.create().parse_overrides(list(overrides)):
        key = item.key_or_group
        if key.startswith("hydra") or OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT:
            continue
        typed = None if item.is_delete() else item.get_value_element_as_str()
        if str(choices.get(key)) != str(typed):
            raise ConfigError(
                f"{key}={typed}: {run_dir} was made with {key}={choices.get(key)}, and a preset cannot be laid "
                f"over a run's saved config; type the keys it would change instead (e.g. model.width_multiplier=0.25)"
            )


def reuse(
    cfg: DictConfig, run_dir: Path, overrides: Sequence[str], keep: Sequence[str] = INVOCATION_KEYS
) -> tuple[DictConfig, list[str]]:
    """The run's saved config, with the `keep` keys and every overridden key taken from `cfg`.

    Args:
        cfg: The config composed for this command line.
        run_dir: A run folder holding `.hydra/config.yaml`.
        overrides: This command line's Hydra overrides (`HydraConfig.get().overrides.task`).
        keep: Keys that always come from `cfg`.

    Returns:
        (the merged config, the keys the command line set besides `mode` and `checkpoint`).

    Raises:
        ConfigError: an override picks a preset of the global package (`experiment=`, `debug=`), which has
            no key of its own to apply: silently ignoring it would be a wrong answer.
    """
    merged = load_saved(run_dir)
    same = _same_options(overrides, run_dir)
    typed_keys = [key for key in override_keys(overrides) if key not in same]
    _check_presets(cfg, run_dir, overrides)
    for key in [*keep, *typed_keys]:
        value = OmegaConf.select(cfg, key, default=_ABSENT)  # a whole node for a group, typed as composed now
        if value is not _ABSENT:
            OmegaConf.update(merged, key, value, merge=False, force_add=True)
    _anchor_data_dir(merged, run_dir, typed_keys)
    return merged, [key for key in typed_keys if key not in ("mode", "checkpoint")]
