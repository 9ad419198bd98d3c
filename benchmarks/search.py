"""The search row: a TPE search on the bundled digits with Optuna's MedianPruner against the same search unpruned.

    python -m benchmarks --only search_pruning

Both run `python run.py -m hparams_search=vgg19_optuna` (VGG19, the digits demo's 12
epochs, the preset's space over lr, dropout, weight decay and batch size; TPE seeded
alike) in their own sweep folder, one process each. The figures are counts, not times:
the epochs all trials trained (each trial's `metrics.json`), and the best trial's
`val_accuracy`, so the machine's load does not move them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT, Row

PRUNER = "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner,n_warmup_steps:3}"
TRIALS = {True: (4, 4), False: (16, 12)}  # (trials, epochs) per mode (quick: True)


def _search(folder: Path, trials: int, epochs: int, *extra: str) -> tuple[int, float]:
    """(epochs trained by every trial, the best val_accuracy of a trial that was not pruned) of one search."""
    overrides = [
        "-m",
        "hparams_search=vgg19_optuna",
        f"hydra.sweeper.n_trials={trials}",
        "hydra.sweeper.sampler.seed=0",
        f"trainer.epochs={epochs}",
        "trainer.verbose=0",
        f"hydra.sweep.dir={folder}",
        *extra,
    ]
    subprocess.run([sys.executable, str(ROOT / "run.py"), *overrides], cwd=ROOT, check=True, capture_output=True)
    runs = [json.loads(path.read_text()) for path in folder.glob("*/metrics.json")]
    assert len(runs) == trials, f"{folder}: {len(runs)} of {trials} trials finished"
    best = max(run["objective"] for run in runs if not run["pruned"])
    return sum(run["epochs_completed"] for run in runs), best


def search_pruning(folder: Path, quick: bool) -> list[Row]:
    trials, epochs = TRIALS[quick]
    pruned_epochs, pruned_best = _search(folder / "pruned", trials, epochs, PRUNER)
    full_epochs, full_best = _search(folder / "unpruned", trials, epochs)
    name = f"{trials}-trial TPE search on digits, MedianPruner(n_warmup_steps=3) vs unpruned"
    return [
        Row(f"{name}: epochs trained", pruned_epochs, full_epochs, "epochs", 0.6, higher_is_better=False),
        # 0.995 of the unpruned best: within 0.5 points of an accuracy near 100%
        Row(f"{name}: best val_accuracy", 100 * pruned_best, 100 * full_best, "%", 0.995),
    ]
