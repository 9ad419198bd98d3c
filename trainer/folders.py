"""Run folders that never collide: a new folder per run (even in the same second), one writer at a time.

    python run.py                    # outputs/DATE/TIME, or outputs/DATE/TIME-2 if that one is taken
    python run.py resume=RUN         # writes into RUN again, under its lock, appending to invocations.jsonl

The resolvers here name Hydra's folders (`hydra.run.dir`, `hydra.sweep.dir`);
`hold` locks a run folder while this process writes it and records the
invocation (start, end, command) in the folder.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from trainer.errors import ConfigError, DiskError, UserError

log = logging.getLogger(__name__)

LOCK = ".lock"
INVOCATIONS = "invocations.jsonl"
_claimed: dict[str, str] = {}


class RunLocked(UserError):
    """Another process is writing the run folder."""


def claim_new_folder(path: str) -> str:
    """Creates and returns `path`, or `path-2`, `path-3`... if taken: the mkdir is the claim, so two
    processes started in the same second (even on two hosts sharing the disk) never get one folder.
    Same answer for the same `path` within a process (Hydra resolves its folder more than once)."""
    if path not in _claimed:
        base = Path(path)
        base.parent.mkdir(parents=True, exist_ok=True)
        candidate, number = base, 1
        while True:
            try:
                candidate.mkdir()
                break
            except FileExistsError:
                number += 1
                candidate = base.with_name(f"{base.name}-{number}")
        _claimed[path] = str(candidate)
    return _claimed[path]


def is_run_folder(path: Path) -> bool:
    """Whether `path` was made by a training run (its saved config, history or backup is there)."""
    return any((path / name).exists() for name in (".hydra/config.yaml", "history.csv", "backup"))


def latest_interrupted(root: Path = Path("outputs")) -> Path:
    """The run under `root` whose backup was written most recently (not the folder made first).

    Raises:
        ConfigError: no run under `root` has a backup.
    """
    backups = [path for path in root.glob("**/backup/training_metadata.json") if path.is_file()]
    if not backups:
        raise ConfigError(f"resume=latest: no run folder under {root}/ has a backup to resume from")
    return max(backups, key=lambda path: path.stat().st_mtime).parent.parent


def resume_folder(resume: str) -> str:
    """The run folder `resume` names (`latest`: the most recently backed-up interrupted run).

    Raises:
        ConfigError: `resume` names no training run folder.
    """
    if resume == "latest":
        return str(latest_interrupted())
    if not Path(resume).is_dir() or not is_run_folder(Path(resume)):
        raise ConfigError(f"resume={resume}: not a training run folder (no .hydra/config.yaml, history.csv or backup/)")
    return resume


def check_resume_argument(arguments: list[str]) -> None:
    """Checks a `resume=` command-line override before Hydra resolves its folder from it (an error
    raised inside Hydra's resolver would print a traceback instead of one line).

    Raises:
        ConfigError: `resume` names no training run folder.
    """
    for argument in arguments:
        if argument.startswith(("resume=", "+resume=", "++resume=")):
            value = argument.split("=", 1)[1].strip("'\"")
            if value and value != "null":
                resume_folder(value)


def hydra_subdir(resume: str | None) -> str | None:
    """`hydra.output_subdir`: `.hydra` for a new run; none for a resumed one, whose `.hydra/` stays the original."""
    return None if resume else ".hydra"


def _holder(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked_error(folder: Path, holder: dict) -> RunLocked:
    return RunLocked(
        f"{folder} is in use by process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
        f"(since {holder.get('start', '?')}); only one process may write a run folder: wait for it to end or stop it"
    )


@contextlib.contextmanager
def run_lock(folder: Path) -> Iterator[None]:
    """Holds `folder/.lock` (an flock, released by the kernel when the process dies) while the body runs.

    The file names the holder (pid, host, start); a lock left by a killed process is taken over.

    Raises:
        RunLocked: another live process holds the folder.
    """
    path = folder / LOCK
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as error:
        raise DiskError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _locked_error(folder, _holder(path.read_text())) from None
        except OSError as error:  # a filesystem without flock: fall back to the recorded pid
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            holder = _holder(path.read_text())
            if holder and (holder.get("host") != socket.gethostname() or _alive(int(holder.get("pid", 0)))):
                raise _locked_error(folder, holder) from None
        previous = _holder(os.pread(descriptor, 4096, 0).decode(errors="replace"))
        if previous.get("pid"):
            log.warning(
                "Took over the lock of %s from process %s on host %s, which is no longer running",
                folder,
                previous["pid"],
                previous.get("host"),
            )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "start": _now()}
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, json.dumps(me).encode(), 0)
        except OSError as error:  # the lock is held; only naming the holder failed
            log.warning("could not write the holder into %s: %s", path, error.strerror or error)
        try:
            yield
        finally:
            os.ftruncate(descriptor, 0)  # released: an empty lock file names nobody
    finally:
        os.close(descriptor)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _record(folder: Path, entry: dict) -> None:
    try:
        with open(folder / INVOCATIONS, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
    except OSError as error:  # a full disk must not hide the error that stopped the run
        log.warning("could not record the invocation in %s: %s", folder / INVOCATIONS, error)


@contextlib.contextmanager
def hold(folder: Path) -> Iterator[dict]:
    """Locks `folder` and records this invocation in `invocations.jsonl`: a start line with the command,
    and an end line with the outcome (`finished`, the error, or what the body sets in the yielded
    dict's `outcome`, e.g. `preempted`). A kill leaves no end line.

    Raises:
        RunLocked: another live process holds the folder.
    """
    with run_lock(folder):
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else ""
        _record(folder, {"event": "start", "time": _now(), "command": command, "pid": os.getpid()})
        status = {"outcome": "finished"}
        try:
            yield status
        except BaseException as error:
            status["outcome"] = f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            raise
        finally:
            _record(folder, {"event": "end", "time": _now(), **status, "pid": os.getpid()})
