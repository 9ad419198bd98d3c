"""The command: `vggtrain [overrides]` (pyproject's console script) or `python run.py [overrides]` in a clone.

    vggtrain                                        # train on the bundled digits; the run folder lands in ./outputs/
    vggtrain dataset=folder dataset.data_dir=photos
    vggtrain -m optimizer.lr=0.1,0.01               # a sweep
    vggtrain --config-dir conf dataset=mine         # a group option of your own: ./conf/dataset/mine.yaml

`cli` makes the checks Hydra cannot make one line of (the other modules of this package), then Hydra
composes the configs and `main` runs one task. A bad file or config value ends the run with one line
naming it; set HYDRA_FULL_ERROR=1 for the full traceback.
"""

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from trainer.cli.arguments import check_arguments
from trainer.cli.hints import missing_extra
from trainer.cli.hydra_files import one_line_when_hydra_cannot_save
from trainer.cli.hydra_mode import UNKNOWN, composed_once
from trainer.cli.overrides import check_composes
from trainer.config import register, reuse
from trainer.errors import DiskError, Interrupted, UserError, one_line
from trainer.runs.folders import (
    check_resume_argument,
    check_run_dir_argument,
    check_writable_output,
    release_claimed_folders,
    remove_if_unused,
)
from trainer.tracking import sweep
from trainer.tracking.sweep import record_failure

register()
SHELL_COMPLETION = {"-sc", "--shell-completion"}  # Hydra's flag; what follows it (install=bash) is no override
_process = {"exit_hard_on_disk_error": True}  # False when `cli` runs inside another program (the tests)


def _share_cores(cfg: DictConfig) -> None:
    """Under the joblib launcher, gives each of its n_jobs parallel jobs cores // n_jobs threads."""
    launcher = HydraConfig.get().launcher
    if cfg.trainer.threads == 0 and "joblib" in str(launcher.get("_target_", "")).lower():
        jobs = launcher.get("n_jobs") or 1
        jobs = os.cpu_count() if jobs < 0 else jobs
        cfg.trainer.threads = max(1, (os.cpu_count() or 1) // jobs)


PACKAGE = Path(__file__).resolve().parents[1]  # trainer/


def config_location(package: Path = PACKAGE) -> tuple[str, str]:
    """Hydra's config_path and the folder it names, for the package folder `trainer/`. Installed from a wheel, the
    configs ship inside the package (its `conf` folder) and Hydra finds them as `pkg://trainer.conf`; in a clone
    (installed editable or not) they are the checkout's own `conf/` beside `trainer/`, so two clones never read
    each other's configs."""
    if (package / "conf" / "config.yaml").is_file():
        return "pkg://trainer.conf", str(package / "conf")
    checkout = str(package.parent / "conf")
    return checkout, checkout


CONFIG_PATH, CONFIG_DIR = config_location()


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> float | None:
    from trainer.tasks import run_task

    _share_cores(cfg)
    hydra = HydraConfig.get()
    try:
        # As typed: iterating Hydra's ListConfig would resolve `trainer.epochs=${oops}` into a traceback
        overrides = OmegaConf.to_container(hydra.overrides.task, resolve=False)
        return run_task(cfg, show_config=True, overrides=overrides)
    except UserError as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if hydra.mode == RunMode.MULTIRUN:  # a failed job is a row of the sweep's table and one line; the rest go on
            logging.getLogger("run").error("error: %s", one_line(error))
            record_failure(Path(hydra.runtime.output_dir), one_line(error))
            return float("nan")  # Optuna counts the trial failed
        if isinstance(error, DiskError) and _process["exit_hard_on_disk_error"]:
            # HDF5 keeps the half-written file's handle and would flush it at interpreter exit, which on a
            # full disk crashes the process (SIGSEGV) after this line; everything written is consistent.
            print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
            from trainer.tracking.curves import wait_for_drawings  # imported by the run already

            wait_for_drawings()  # a curves.png being drawn ends (or fails) and removes its temporary file
            logging.shutdown()
            os._exit(1)
        sys.exit(f"error: {one_line(error)}")
    finally:
        if hydra.mode != RunMode.MULTIRUN and not cfg.get("resume"):
            remove_if_unused(Path(hydra.runtime.output_dir))  # nothing but .hydra/ and run.log: no folder


def cli(arguments: list[str] | None = None, exit_hard_on_disk_error: bool = True) -> float | None:
    """`vggtrain ARGUMENTS` (`python run.py ARGUMENTS`): the checks Hydra cannot make one line of, then Hydra and
    the task.

    Raises:
        SystemExit: bad input (its code is the one-line error), or Hydra's own exit.
    """
    arguments = reuse.with_run_options(sys.argv[1:] if arguments is None else arguments)
    _process["exit_hard_on_disk_error"] = exit_hard_on_disk_error
    composed = UNKNOWN
    if not SHELL_COMPLETION.intersection(arguments):  # `-sc install=bash`: Hydra's words, no run, nothing to check
        composed = _check_before_hydra(arguments)
    saved, sys.argv = sys.argv, [sys.argv[0] if sys.argv else "run.py", *arguments]
    sweep.OUTCOME.clear()
    previous = _sigterm_stops_a_sweep(arguments)
    try:
        with one_line_when_hydra_cannot_save(), composed_once(composed):  # Hydra writes .hydra/ before main() runs
            result = main()
        if sweep.OUTCOME.get("failed"):  # the table is printed; the exit code says some jobs failed
            outcome = sweep.OUTCOME
            sys.exit(f"error: {outcome['failed']} of {outcome['jobs']} jobs failed; see {outcome['summary']}")
        return result
    except KeyboardInterrupt as interrupt:  # Ctrl-C: in training the backup is saved first (trainer.errors)
        print(str(interrupt) or "interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        sys.argv = saved
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        release_claimed_folders()


def _check_before_hydra(arguments: list[str]) -> Any:
    """The command's one-line errors that Hydra would give as a traceback or many lines, or too late. Returns
    the config as its compose found it, for Hydra (`trainer.cli.hydra_mode`), or `UNKNOWN`.

    Raises:
        SystemExit: the one line.
    """
    if hint := missing_extra(arguments):
        sys.exit(f"error: {hint}")
    try:
        check_arguments(arguments)  # trainer.epoch=2: our one line, not Hydra's seven
        # trainer.epochs=one, optimizer=adamm, dataset.imag_size=64
        composed = check_composes(arguments, CONFIG_DIR, CONFIG_PATH)
        mode = UNKNOWN if composed is UNKNOWN else composed.mode
        check_writable_output(arguments)  # first: the run folder's lock below makes the folder
        check_run_dir_argument(arguments)  # Hydra writes .hydra/ into it before main() runs
        multirun = mode == RunMode.MULTIRUN or "hydra.mode=MULTIRUN" in arguments  # -m: the check sees it
        check_resume_argument(arguments, multirun)  # ... and makes the run folder from it
        return composed
    except UserError as error:
        release_claimed_folders()
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the debug flag: the error with its traceback
            raise
        sys.exit(f"error: {one_line(error)}")


def _interrupted_by_sigterm(signum: int, frame: object) -> None:
    raise Interrupted("interrupted (SIGTERM)")


def _sigterm_stops_a_sweep(arguments: list[str]) -> object:
    """In a sweep (`-m`), SIGTERM stops the sweep as Ctrl-C does, wherever it lands (exit 130, the running trial
    run again by the same command); in training, trainer.training.callbacks saves a backup first. Returns the
    handler it replaced, None where it replaced none."""
    multirun = any(argument in ("-m", "--multirun", "hydra.mode=MULTIRUN") for argument in arguments)
    if not multirun or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupted_by_sigterm)
