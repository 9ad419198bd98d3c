"""The `vggtrain` command (pyproject's console script): `python run.py` from any folder, once installed.

    pip install .                                   # or a wheel built from the repository
    vggtrain                                        # trains the demo; the run folder lands in ./outputs/
    vggtrain dataset=folder dataset.data_dir=photos
    python -m vggtrain --help                       # the same command

The package is named `trainer`, as is another distribution on the package index. This module finds where
`import trainer` would load from, before importing anything of it: someone else's package there is one line.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

OWN_FILE = Path("cli", "main.py")  # in vggtrain's trainer/ only: the command's own module


def foreign_trainer() -> str | None:
    """Where `import trainer` finds a package that is not vggtrain's, or None where it finds vggtrain's.

    Raises:
        SystemExit: no package `trainer` at all (vggtrain's install is broken).
    """
    spec = importlib.util.find_spec("trainer")
    if spec is None:
        sys.exit("error: vggtrain's package `trainer` is not installed; reinstall vggtrain (pip install vggtrain)")
    folders = [Path(folder) for folder in spec.submodule_search_locations or []]
    if any((folder / OWN_FILE).is_file() for folder in folders):
        return None
    return str(folders[0] if folders else spec.origin)


def main() -> int:
    """`vggtrain ARGUMENTS`: checks that `trainer` is vggtrain's, then runs the command (trainer.cli.main)."""
    if (found := foreign_trainer()) is not None:
        sys.exit(
            f"error: `import trainer` finds another package, {found}, not vggtrain's (a distribution also named "
            "trainer, or a folder on PYTHONPATH): uninstall it or take it off PYTHONPATH"
        )
    from trainer.cli.main import cli

    cli()
    return 0  # the console script exits with this; the run's objective is in its metrics.json


if __name__ == "__main__":
    sys.exit(main())
