"""Continue a killed or preempted run: find its folder, its backup, and trim its history to what is saved.

python run.py resume=outputs/2026-11-30/12-00-00     # or resume=latest

The backup is `RUN/backup/`. In a multi-worker run only the chief's counts: every other worker's folder
is a fresh temporary one on each start, and it takes the chief's progress and state
(`trainer.distribute.agreement`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

from trainer.errors import ConfigError
from trainer.runs import digest, folders, history
from trainer.runs.atomic import write_json
from trainer.runs.backup import read_state
from trainer.runs.checkpoints import commit_best

log = logging.getLogger(__name__)


def resolve_resume(resume: str | None, output_dir: str) -> str:
    """The folder a run writes to: `resume` (an earlier run folder, or `latest`) or Hydra's new folder.

    With run.py, Hydra's folder already is the resumed one (`hydra.run.dir` follows `resume`).

    Raises:
        ConfigError: `resume` names no run folder.
    """
    if not resume:
        return output_dir
    # resume=latest is resolved once: Hydra's resolver picked the folder that run.log already writes to. Picked
    # again here, a run finishing meanwhile would send the training to another folder than its log.
    picked = resume == "latest" and folders.is_run_folder(Path(output_dir))
    folder = output_dir if picked else folders.resume_folder(resume)
    if resume == "latest":
        log.info("resume=latest: continuing %s, the interrupted run whose backup was written last", folder)
    return folder


class Progress(NamedTuple):
    """What a run's backup holds: `done` finished epochs, then `steps` steps of the next one (a backup made within
    an epoch: SIGTERM, Ctrl-C, `trainer.save_every_steps`); `ended` says why training ended already
    (`stopped_early`), or is empty."""

    done: int = 0
    steps: int = 0
    ended: str = ""


def prepare_resume(run_dir: Path, backup_dir: Path, resume: str | None) -> Progress:
    """What the backup holds; trims history.csv to exactly its finished epochs, so none appears twice.

    A run killed before its first epoch ended has no backup: it starts again
    from epoch 1 (or, stopped by a signal, goes on from the step its backup holds). A run whose epochs are all
    done but whose metrics.json is missing (killed in the test evaluation) still has its backup.

    Raises:
        ConfigError: `resume` points at a run that finished (it has its metrics.json), or at an unreadable backup.
    """
    if resume and (run_dir / "metrics.json").is_file():
        raise ConfigError(
            f"resume={resume}: the run finished (it has metrics.json); to train on from its weights, start a new "
            f"run with model.init_from={run_dir} (its own folder, config and schedule, e.g. trainer.epochs=20)"
        )
    state = read_state(backup_dir)
    done = state.epoch if state else 0
    history.trim(run_dir / history.FILE, done)
    if (run_dir / "checkpoints").is_dir():
        commit_best(run_dir / "checkpoints", done)  # a new best whose epoch the kill left uncommitted goes
    if resume:
        if state and (done or state.batch):
            steps = f"{state.batch} step(s) of epoch {done + 1}"
            after = f"epoch {done}" if done else steps
            also = f" ({steps} too)" if done and state.batch else ""
            log.info("Resuming %s after %s from %s%s <resume=%s>", run_dir, after, state.weights, also, resume)
        else:
            log.info("No epoch of %s was finished: training it from epoch 1 <resume=%s>", run_dir, resume)
    return Progress(done, state.batch if state else 0, state.ended if state else "")


CHIEF_RUN = "RUN (the chief's run folder, named in its log)"  # what another worker of a multi-worker run resumes

DATA_FILE = "data.json"  # in the run folder: what the run trains on (`trainer.data.module.fingerprint`)


def _difference(recorded: dict, current: dict) -> str:
    """The first way the data differs, e.g. `train: 1238 -> 1200 records` or a file of a split."""
    for split in sorted(recorded.keys() | current.keys()):
        old, new = recorded.get(split) or {}, current.get(split) or {}
        if old.get("records") != new.get("records"):
            return f"{split}: {old.get('records')} -> {new.get('records')} records"
        for before, after in zip(old.get("files", []), new.get("files", []), strict=False):
            if before[:2] == after[:2] and before != after:
                return f"{split}: {before[0]} has other content"
            if before != after:
                return f"{split}: {before[0]} ({before[1]:,} bytes) -> {after[0]} ({after[1]:,} bytes)"
        if len(old.get("files", [])) != len(new.get("files", [])):
            return f"{split}: {len(old.get('files', []))} -> {len(new.get('files', []))} files"
    return "the recorded fingerprint"


def _recorded(path: Path) -> dict | None:
    """`data.json`'s content; None when it is missing, unreadable or not a JSON object."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def bind_data(run_dir: Path, fingerprint: dict, resume: str | None, allow_change: bool = False, done: int = 0) -> None:
    """Records the data a run trains on (`RUN/data.json`); a resume must find the same data: the same files
    (a moved copy passes: names, sizes and record ranges are compared, not folders) and record counts. The
    whole-file checksums the first epoch recorded (`trainer.runs.digest`) are kept for its `DigestGate`.

    Raises:
        ConfigError: resuming on other data, or a run with `done` epochs whose data.json is missing or
            unreadable, without `allow_data_change=true`.
    """
    path = run_dir / DATA_FILE
    recorded = _recorded(path) if resume else None
    if resume and done and recorded is None and not allow_change:
        raise ConfigError(
            f"resume={resume}: {path} is missing or unreadable, so the data cannot be checked against what the "
            f"run trained on; continue on this data knowingly with allow_data_change=true"
        )
    digests = (recorded or {}).pop(digest.KEY, None)
    if recorded is not None and recorded != fingerprint:
        change = _difference(recorded, fingerprint)
        if not allow_change:
            raise ConfigError(
                f"resume={resume}: the data differs from what {run_dir} trained on ({change}); point "
                f"dataset.data_dir at that data, or continue on this data with allow_data_change=true"
            )
        log.warning("Resuming %s on other data than it trained on (%s) <allow_data_change=true>", run_dir, change)
        digests = None  # other files: the first epoch records theirs
    write_json(path, {**fingerprint, **({digest.KEY: digests} if digests is not None else {})})
