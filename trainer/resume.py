"""Continue a killed or preempted run: find its folder, its backup, and trim its history to what is saved.

python run.py resume=outputs/2026-11-30/12-00-00     # or resume=latest
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import tempfile
from pathlib import Path

from trainer.errors import ConfigError
from trainer.reports import write_atomic

log = logging.getLogger(__name__)


def resolve_resume(resume: str | None, output_dir: str) -> str:
    """The folder a run writes to: `resume` (an earlier run folder, or `latest`) or Hydra's new folder.

    Raises:
        ConfigError: `resume` names no run folder.
    """
    if not resume:
        return output_dir
    if resume == "latest":
        candidates = sorted(Path("outputs").glob("*/*/backup"), key=lambda path: path.stat().st_mtime)
        if not candidates:
            raise ConfigError("resume=latest: no run folder under outputs/ has a backup to resume from")
        return str(candidates[-1].parent)
    if not (Path(resume) / "history.csv").is_file() and not (Path(resume) / "backup").is_dir():
        raise ConfigError(f"resume={resume}: not a training run folder (no history.csv or backup/ in it)")
    return resume


def backup_folder(run_dir: Path, output_dir: str, worker: str | None) -> Path:
    """Where BackupAndRestore keeps this worker's state: the run folder for the chief (`worker=None`),
    else a temporary folder named after the run and the worker, so a rerun of that worker (with
    resume=PATH) finds it and two workers never share one."""
    if worker is None:
        return run_dir / "backup"
    key = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"vggtrain-backup-{key}-{worker}"


def prepare_resume(run_dir: Path, backup_dir: Path, resume: str | None) -> int:
    """Epochs already done per the backup; trims history.csv to exactly those, so none appears twice.

    Raises:
        ConfigError: `resume` points at a run that finished (its backup is gone).
    """
    metadata = backup_dir / "training_metadata.json"
    done = json.loads(metadata.read_text())["epoch"] if metadata.is_file() else 0
    history_csv = run_dir / "history.csv"
    if resume and not done and history_csv.is_file():
        raise ConfigError(f"resume={resume}: the run finished (no backup left); start a new run instead")
    if history_csv.is_file():
        lines = history_csv.read_text().splitlines(keepends=True)
        kept = lines[:1] + [line for line in lines[1:] if int(line.split(",", 1)[0]) < done]
        if kept != lines:
            write_atomic(history_csv, lambda temporary: temporary.write_text("".join(kept)))
    if done:
        log.info("Resuming after epoch %d from %s <resume=%s>", done, backup_dir, resume)
    return done


def read_history(path: Path) -> dict[str, list[float]]:
    """history.csv as columns of floats: every epoch of the run, resumed parts included."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {name: [float(row[name]) for row in rows] for name in rows[0]} if rows else {}
