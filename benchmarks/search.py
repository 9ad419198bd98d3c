"""The search rows: on the bundled digits, the same TPE search pruned by successive halving (hparams_search=vgg19_asha),
by Hyperband (vgg19_hyperband) and by Optuna's MedianPruner, each against the same search unpruned. Every pruned
search here tells its pruner the training accuracy (the presets' `objective.prune_metric`), the MedianPruner one too
(it runs the vgg19_asha preset).

    python -m benchmarks --only search_pruning            # 16 trials x 12 epochs, sampler seeds 0, 1, 2
    python -m benchmarks --only search_pruning --quick    # successive halving and unpruned, seed 0 only

Every search is `python run.py -m hparams_search=vgg19_asha` (or vgg19_hyperband, the same space: lr over three
decades, weight decay, dropout, width; batch 64 for all) in its own sweep folder, one process
each, with the pruner swapped; seed s seeds TPE and the trials alike. The figure's pair runs
first, seed by seed, then Hyperband and MedianPruner; each search logs its own figures as it
ends (stderr), so a run cut short still shows the seeds it measured. The model is the
demo's (fc 512) at the preset's two smaller widths (`BENCHMARK`: 1/8, 1/4; 32x32 is VGG19's smallest input),
and the validation split is 400 of digits' 1,438 training records (the default 200 makes the
0.5-point target a single image). The figures are counts, not times: the epochs all trials trained (each trial's
`metrics.json`) and the best trial's `val_accuracy` (of a trial that was not pruned),
each the mean over the seeds, so the machine's load does not move them. The targets:
a pruned search trains at most 0.4 of the epochs of the unpruned one, and its best is
within 0.5 points of the unpruned best; the MedianPruner rows are reported as they are.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from benchmarks.common import ROOT, Row

TRIALS, EPOCHS = 16, 12
SEEDS = {True: (0,), False: (0, 1, 2)}  # quick: True
BENCHMARK = [  # the demo's model at its smaller widths: the figures count epochs and compare bests
    "model.width_multiplier=choice(0.125,0.25)",  # a command-line sweep replaces the preset's widths
    "dataset.val_size=400",  # 0.5 points is two validation images (digits' default 200 makes it one)
    "evaluate.report=false",
    "logger=csv",
]
SEARCHES = {  # name: (its folder, the preset, the overrides that swap its pruner, the ratio target of its epochs)
    "successive halving (vgg19_asha)": ("asha", "vgg19_asha", (), 0.4),
    "Hyperband (vgg19_hyperband)": ("hyperband", "vgg19_hyperband", (), 0.4),
    "MedianPruner(n_warmup_steps=3)": (
        "median",
        "vgg19_asha",
        ("hydra.sweeper.pruner=null", "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner,n_warmup_steps:3}"),
        None,
    ),
    "unpruned": ("unpruned", "vgg19_asha", ("hydra.sweeper.pruner=null",), None),
}
QUICK = ("successive halving (vgg19_asha)", "unpruned")  # --quick: the figure's pair, on seed 0
POINTS = 0.5  # the pruned search's best within this many points of the unpruned best


def _search(folder: Path, seed: int, preset: str, pruner: tuple[str, ...]) -> None:
    """Runs one search into its own sweep folder."""
    overrides = [
        "-m",
        f"hparams_search={preset}",
        f"hydra.sweeper.n_trials={TRIALS}",
        f"seed={seed}",  # the sampler's seed too (the preset's ${seed})
        f"trainer.epochs={EPOCHS}",
        "trainer.verbose=0",
        f"hydra.sweep.dir={folder}",
        *BENCHMARK,
        *pruner,  # null first, then another: Hydra merges a dict into the preset's pruner
    ]
    command = ["nice", "-n", "19", sys.executable, str(ROOT / "run.py"), *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{folder}: exit {done.returncode}: {done.stderr[-2000:]}")


def counted(folder: Path) -> tuple[int, float]:
    """(epochs trained by every trial, the best val_accuracy of a trial that was not pruned) of a search's folder."""
    runs = [json.loads(path.read_text()) for path in folder.glob("*/metrics.json")]
    if len(runs) != TRIALS:
        raise ValueError(f"{folder}: {len(runs)} of {TRIALS} trials finished")
    best = max(run["objective"] for run in runs if not run["pruned"])
    return sum(run["epochs_completed"] for run in runs), best


def rows(figures: dict[str, tuple[list[int], list[float]]], seeds: tuple[int, ...]) -> list[Row]:
    """The rows of `figures` ({search name: ([epochs per seed], [best per seed])}, "unpruned" among them)."""
    full_epochs, full_best = (statistics.mean(values) for values in figures["unpruned"])
    shown = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean of seeds {', '.join(map(str, seeds))}"
    result = []
    for name, (epochs, bests) in figures.items():
        if name == "unpruned":
            continue
        label = f"{TRIALS}-trial TPE search on digits ({shown}), {name} vs unpruned"
        target = SEARCHES[name][3]
        result.append(Row(f"{label}: epochs trained", statistics.mean(epochs), full_epochs, "epochs", target, False))
        best_target = None if target is None else 1 - POINTS / (100 * full_best)  # within 0.5 points
        result.append(
            Row(f"{label}: best val_accuracy", 100 * statistics.mean(bests), 100 * full_best, "%", best_target)
        )
    return result


def _order(seeds: tuple[int, ...], quick: bool) -> list[tuple[str, int]]:
    """(search, seed) in the order they run: the figure's pair (unpruned, successive halving) seed by seed, then the
    other pruners seed by seed."""
    pair = [(name, seed) for seed in seeds for name in ("unpruned", QUICK[0])]
    return pair if quick else pair + [(name, seed) for name in SEARCHES if name not in QUICK for seed in seeds]


def code_key() -> str:
    """The commit and a digest of the working tree's changes (tracked files' diff, untracked files' names and
    contents): searches measured under another key are not reused. Outside git: none is ever reused."""

    def git(*arguments: str) -> bytes:
        return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True).stdout

    head = git("rev-parse", "--short", "HEAD").decode().strip()
    if not head:
        return f"nogit-{uuid.uuid4().hex[:10]}"
    digest = hashlib.sha256(git("diff", "HEAD"))
    for name in sorted(git("ls-files", "--others", "--exclude-standard").decode().splitlines()):
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return f"{head}-{digest.hexdigest()[:10]}"


def _finished(folder: Path) -> bool:
    try:
        counted(folder)
    except (OSError, ValueError):
        return False
    return True


def search_pruning(folder: Path, quick: bool) -> list[Row]:
    """Each search's sweep folder is kept in outputs/benchmarks/search_pruning/CODE_KEY/ (`code_key`): the case
    run again at the same code reuses every search that finished and runs the others from the start."""
    seeds, measured = SEEDS[quick], {}
    kept = ROOT / "outputs" / "benchmarks" / "search_pruning" / code_key()
    for name, seed in _order(seeds, quick):
        key, preset, pruner, _ = SEARCHES[name]
        search = kept / f"{key}_{seed}"
        reused = _finished(search)
        if not reused:
            shutil.rmtree(search, ignore_errors=True)  # a search cut short: its study would count a retried trial
            _search(search, seed, preset, pruner)
        measured[name, seed] = counted(search)
        epochs, best = measured[name, seed]
        print(f"search_pruning: {name}, seed {seed}: {epochs} epochs, best val_accuracy {100 * best:.1f}"
              f"{' (reused: ' + str(search) + ')' if reused else ''}", file=sys.stderr, flush=True)  # fmt: skip
    names = [name for name in SEARCHES if (name, seeds[0]) in measured]
    figures = {name: ([measured[name, seed][0] for seed in seeds], [measured[name, seed][1] for seed in seeds])
               for name in names}  # fmt: skip
    return rows(figures, seeds)
