"""The command line, checked before Hydra starts: a key its section does not have, an override Hydra cannot read.

    python run.py trainer.epoch=2     # error: trainer.epoch is not a key of trainer; did you mean trainer.epochs?
    python run.py +trainer.epoch=2    # the same line (Hydra's `+` would add the key, and nothing would read it)
    python run.py dataset=cifar dataset.imag_size=64    # the same, against the section dataset=cifar composes

Hydra's own message for the first is seven lines and suggests the second, which OmegaConf then
dropped without a word. Sections whose schema is open (`dataset=custom`, `model=custom`,
`callbacks`) take any key. The line itself is `trainer.config.typos.unknown_key`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf

from trainer.config import schema
from trainer.config.typos import unknown_key
from trainer.errors import ConfigError

# Sections whose schema does not depend on a config group: their keys can be checked before Hydra composes.
FIXED_SECTIONS = ("trainer", "objective", "evaluate", "predict", "inspect", "finetune", "export", "trial")
GROUP_SECTIONS = ("dataset", "model", "optimizer", "strategy")  # their keys depend on the option chosen


def _key(argument: str) -> str:
    return argument.lstrip("+~").split("=", 1)[0]


def check_group_keys(arguments: list[str], config_dir: str) -> None:
    """`dataset.KEY=...` (and `model.`, `optimizer.`, `strategy.`) against the section this command composes,
    before Hydra's seven lines: the config is composed once without those arguments, then each key looked up.
    A command Hydra could not compose, or one sweeping a config group, is left to Hydra.

    Raises:
        ConfigError: a key the composed section does not have, naming the nearest.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [item for item in arguments if "=" in item and not item.startswith("-")]
    checked = [item for item in overrides if "." in _key(item) and _key(item).split(".")[0] in GROUP_SECTIONS]
    if not checked:
        return
    parser = OverridesParser.create()
    rest = []
    for item in overrides:
        if item in checked or _key(item).startswith(("hydra.", "hydra/")):
            continue
        if parser.parse_overrides([item])[0].is_sweep_override():
            if "." not in _key(item):
                return  # a sweep over a config group: each job composes another section
            continue
        rest.append(item)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            config = compose("config", overrides=rest)
    except Exception:  # noqa: BLE001 - Hydra says what is wrong with the command when it composes it
        return
    finally:
        GlobalHydra.instance().clear()
    for item in checked:
        _check_path(config, _key(item))


def _check_path(config: DictConfig, path: str) -> None:
    """Raises the one line for the first name of `path` its composed section lacks (an open schema takes any)."""
    node: Any = config
    names = path.split(".")
    for depth, name in enumerate(names):
        if not isinstance(node, DictConfig):
            return
        if name not in node.keys():  # `in node` is False for a missing (???) value too
            if getattr(OmegaConf.get_type(node), "OPEN", None) or not OmegaConf.is_struct(node):
                return
            raise unknown_key(".".join(names[: depth + 1]), [str(key) for key in node.keys()])
        node = node._get_node(name)


def check_grammar(arguments: list[str]) -> None:
    """Each override as Hydra's grammar reads it (`interval(0, 1)`, quotes, lists), before Hydra's seven lines.

    Raises:
        ConfigError: an override Hydra cannot read, with Hydra's reason.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for argument in arguments:
        if argument.startswith("-") or "=" not in argument:  # a flag, or a flag's value (--cfg job)
            continue
        try:
            parser.parse_overrides([argument])
        except OverrideParseException as error:
            key, value = argument.split("=", 1)
            if value.startswith("~"):  # bash expands ~ only after a plain NAME=, not after dataset.data_dir=
                raise ConfigError(
                    f"{argument}: the shell leaves ~ as it is after a dotted key, and Hydra cannot read it; "
                    f"write {key}=$HOME{value[1:]}"
                ) from None
            lines = [line.strip() for line in str(error).splitlines()]
            skipped = ("See ", "Set ", "LexerNoViableAltException")  # a link, advice, the echo and its caret line
            reason = " ".join(line for line in lines if line.strip("^ ") and not line.startswith(skipped))
            raise ConfigError(
                f"{argument}: Hydra cannot read this override ({reason or 'bad syntax'}); quote a text value: KEY='...'"
            ) from None


COMMANDS = {  # Hydra does one of these per command line (its ValueError, a traceback, for two)
    "--run": ("--run", "-r"),
    "--multirun": ("--multirun", "-m"),
    "--cfg": ("--cfg", "-c"),
    "--info": ("--info", "-i"),
    "--shell-completion": ("--shell-completion", "-sc"),
}


def check_commands(arguments: list[str]) -> None:
    """At most one of Hydra's commands (`-m` and `--cfg job` together: a traceback from Hydra).

    Raises:
        ConfigError: two or more, named, with how to print a search's config.
    """
    flags = {argument.split("=", 1)[0] for argument in arguments if argument.startswith("-")}
    given = [command for command, spellings in COMMANDS.items() if flags & set(spellings)]
    if len(given) > 1:
        raise ConfigError(
            f"{' and '.join(given)}: Hydra takes one of {', '.join(COMMANDS)} per command; to print a search's "
            f"config leave out --multirun (its hparams_search preset sets hydra.mode=MULTIRUN)"
        )


def check_arguments(arguments: list[str]) -> None:
    """The command line's `[+]trainer.KEY=...` (and the other fixed sections') before Hydra composes, Hydra's
    commands and each override's grammar.

    Raises:
        ConfigError: a key its section does not have; two of Hydra's commands; an override Hydra cannot read.
    """
    check_commands(arguments)
    check_grammar(arguments)
    hints = get_type_hints(schema.Config)
    for argument in arguments:
        if argument.startswith("-") or "=" not in argument:
            continue
        path = argument.split("=", 1)[0].lstrip("+~")
        names = path.split(".")
        if names[0] not in FIXED_SECTIONS or len(names) < 2:
            continue
        kind = hints[names[0]]
        for depth, name in enumerate(names[1:], start=1):
            fields = {item.name: item for item in dataclasses.fields(kind)}
            if name not in fields:
                raise unknown_key(".".join(names[: depth + 1]), list(fields))
            kind = get_type_hints(kind).get(name)
            if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
                break
