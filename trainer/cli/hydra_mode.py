"""Hydra composes the config once less: the run mode comes from the compose `trainer.cli.overrides` makes anyway.

    python run.py debug=smoke     # composed twice (our check, then Hydra's run), not three times

Before it runs or sweeps, Hydra's `_run_hydra` calls `Hydra.get_mode`, which composes the whole config only to
read `hydra.mode` and throws it away (upstream hydra#3440); then `run()` composes it again. The command's check
(`check_composes`) has already composed it with the same overrides, so `mode_known` answers `get_mode` from that
for one command (docs/development.md, the ledger of workarounds; tests/test_upstream_canaries.py checks that
`get_mode` still composes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

UNKNOWN = object()  # the check did not compose the command's config as Hydra will: let Hydra find the mode


@contextlib.contextmanager
def mode_known(mode: Any) -> Iterator[None]:
    """While the body runs, Hydra's `get_mode` returns `mode` (the config's `hydra.mode`: None, RUN or
    MULTIRUN) without composing, unless `mode` is `UNKNOWN`."""
    if mode is UNKNOWN:
        yield
        return
    from hydra._internal.hydra import Hydra

    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: mode
    try:
        yield
    finally:
        Hydra.get_mode = original
