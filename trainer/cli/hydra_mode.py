"""Hydra composes the config once: its run takes the compose `trainer.cli.overrides` makes for its checks anyway.

    python run.py debug=smoke     # composed once (the command's check), not three times

Before it runs or sweeps, Hydra's `_run_hydra` calls `Hydra.get_mode`, which composes the whole config only to
read `hydra.mode` and throws it away (upstream hydra#3440); then `run()` composes it again. The command's check
(`check_composes`) has already composed it with the same overrides, through the same `Hydra.compose_config`. So
for one command `composed_once` answers `get_mode` from that compose, and gives `run()` the config itself where
`run()` asks for exactly the overrides it was composed with (docs/development.md, the ledger of workarounds;
tests/test_upstream_canaries.py checks that `get_mode` still composes, tests/test_startup.py that the config run
gets is the one Hydra would compose).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

UNKNOWN = object()  # the check did not compose the command's config as Hydra will: let Hydra compose it
RUN_MODE = "hydra.mode=RUN"  # what Hydra's `_run_app` adds to the overrides when the config names no mode


@dataclass
class Composed:
    """The command's config as its check composed it (with its `hydra` node), and the overrides it took: None
    where they are not all the command's (a flag such as -m or --cfg, a sweep, a `hydra.mode` or `hydra/` setting),
    so that Hydra composes its own."""

    config: Any
    overrides: tuple[str, ...] | None

    @property
    def mode(self) -> Any:
        """The config's `hydra.mode`: None (the command line decides), RUN or MULTIRUN."""
        return self.config.hydra.mode

    def take(self, config_name: str | None, overrides: list[str], run_mode: Any) -> Any:
        """The config, once, for Hydra's run compose of `overrides` (None where it was composed otherwise): Hydra
        adds `hydra.mode=RUN` to a command whose config names no mode, and that is set here as its compose would."""
        from hydra.types import RunMode
        from omegaconf import open_dict, read_write

        if self.overrides is None or config_name != "config" or run_mode != RunMode.RUN:
            return None
        ours = list(self.overrides)
        added = overrides == [*ours, RUN_MODE]
        if overrides != ours and not added:
            return None
        self.overrides = None  # taken once: a later compose is Hydra's own
        if added:
            with read_write(self.config.hydra), open_dict(self.config.hydra):
                self.config.hydra.mode = RunMode.RUN
                self.config.hydra.overrides.hydra.append(RUN_MODE)
        return self.config


@contextlib.contextmanager
def composed_once(composed: Any) -> Iterator[None]:
    """While the body runs, Hydra's `get_mode` returns the check's `hydra.mode` without composing, and Hydra's run
    compose takes the check's config (`Composed.take`), unless `composed` is `UNKNOWN`."""
    if composed is UNKNOWN:
        yield
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra

    get_mode, load = Hydra.get_mode, ConfigLoaderImpl.load_configuration

    def load_configuration(self, config_name, overrides, run_mode, **settings):
        taken = composed.take(config_name, list(overrides), run_mode)
        return load(self, config_name, overrides, run_mode, **settings) if taken is None else taken

    Hydra.get_mode = lambda self, config_name, overrides: composed.mode
    ConfigLoaderImpl.load_configuration = load_configuration
    try:
        yield
    finally:
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = get_mode, load
