"""Hydra's own files of a run folder, `.hydra/*.yaml`, written before any task runs: a full disk is one line.

    python run.py     # on a full disk: error: cannot write outputs/DATE/TIME/.hydra/config.yaml: No space left ...

Hydra writes them in `run_job` through its private `_save_config`, and an error there ends in
Hydra's traceback. `one_line_when_hydra_cannot_save` wraps that function for one command
(docs/development.md, the ledger of workarounds; tests/test_upstream_canaries.py checks that
`run_job` still calls it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core import utils as hydra_utils


def _saving(save: Any) -> Any:
    def save_or_exit(cfg: Any, filename: str, output_dir: Path) -> None:
        try:
            save(cfg, filename, output_dir)
        except OSError as error:  # SystemExit passes Hydra's report of an Exception, as `sys.exit` does
            reason = error.strerror or str(error)
            raise SystemExit(f"error: cannot write {Path(output_dir) / filename}: {reason}") from None

    return save_or_exit


@contextlib.contextmanager
def one_line_when_hydra_cannot_save() -> Iterator[None]:
    """While the body runs, a `.hydra/` file Hydra cannot write (full disk, quota, read-only) exits with one
    `error:` line naming it, code 1; nothing of the task has run then."""
    original = hydra_utils._save_config
    hydra_utils._save_config = _saving(original)
    try:
        yield
    finally:
        hydra_utils._save_config = original
