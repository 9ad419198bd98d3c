"""One writer per run folder: an OS file lock held while a process writes it, and a record of every invocation.

    python run.py resume=RUN         # a second `resume=RUN` while the first runs: one error naming its holder

`hold` locks a run folder while this process writes it and records the invocation
(start, end, command, outcome) in `invocations.jsonl`.
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

from trainer.errors import DiskError, UserError

log = logging.getLogger(__name__)

LOCK = ".lock"
INVOCATIONS = "invocations.jsonl"


class RunLocked(UserError):
    """Another process is writing the run folder."""


def _holder(text: str) -> dict:
    """The lock file's record of its holder; {} for anything else (a damaged or hand-edited `.lock`)."""
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(holder, dict):
        return {}
    if not isinstance(holder.get("pid"), int) or isinstance(holder.get("pid"), bool):
        holder.pop("pid", None)
    return holder


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


def is_held(folder: Path) -> bool:
    """Whether a live process holds `folder/.lock` now (a dead holder's lock is not held)."""
    try:
        descriptor = os.open(folder / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a filesystem without flock: the recorded holder, if alive here
        holder = _holder(os.pread(descriptor, 4096, 0).decode(errors="replace"))
        return bool(holder.get("pid")) and holder.get("host") == socket.gethostname() and _alive(holder["pid"])
    finally:
        os.close(descriptor)
    return False


@contextlib.contextmanager
def run_lock(folder: Path) -> Iterator[None]:
    """Holds `folder/.lock` (an flock, released by the kernel when the process dies) while the body runs.

    The file names the holder (pid, host, start); a lock left by a killed process is taken over. A lock this
    process `claim`ed is the one it holds.

    Raises:
        RunLocked: another live process holds the folder.
    """
    path = folder / LOCK
    descriptor, previous = _claims.pop(path.resolve(), (None, {}))
    if descriptor is None:
        descriptor = _open(path)
        try:
            previous = _take(folder, descriptor)
        except BaseException:
            os.close(descriptor)
            raise
    try:
        if previous.get("pid"):
            log.warning(
                "Took over the lock of %s from process %s on host %s, which is no longer running",
                folder,
                previous["pid"],
                previous.get("host"),
            )
        try:
            yield
        finally:
            os.ftruncate(descriptor, 0)  # released: an empty lock file names nobody
    finally:
        os.close(descriptor)


def _take(folder: Path, descriptor: int) -> dict:
    """Locks `folder/.lock` (open as `descriptor`) for this process and names it the holder there. Returns the
    previous holder's record: a killed process's, else {}.

    Raises:
        RunLocked: another live process holds the folder.
    """
    path = folder / LOCK
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
    me = {"pid": os.getpid(), "host": socket.gethostname(), "start": _now()}
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(me).encode(), 0)
    except OSError as error:  # the lock is held; only naming the holder failed
        log.warning("could not write the holder into %s: %s", path, error.strerror or error)
    return previous


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as error:
        raise DiskError(f"cannot write {path}: {error.strerror or error}") from None


# lock file -> (descriptor, the previous holder's record): folders this process locked before it writes them
_claims: dict[Path, tuple[int, dict]] = {}


def claim(folder: Path) -> None:
    """Takes `folder/.lock` now, before anything is written into `folder` (Hydra writes `.hydra/` and run.log
    before the run starts; a resume builds its data and model first), and keeps it for this process's
    `run_lock`: a second command cannot slip in between, and is refused before it writes anything.

    Raises:
        RunLocked: another live process holds the folder.
        DiskError: the folder cannot be made or written.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DiskError(f"cannot make the run folder {folder}: {error.strerror or error}") from None
    path = folder / LOCK
    descriptor = _open(path)
    try:
        previous = _take(folder, descriptor)
    except RunLocked:
        os.close(descriptor)
        raise
    except OSError:  # the lock cannot be taken here: run_lock tries again and says why
        os.close(descriptor)
        return
    _claims[path.resolve()] = (descriptor, previous)


def is_claimed(folder: Path) -> bool:
    """Whether this process `claim`ed `folder` and holds its lock for the run it starts."""
    return (folder / LOCK).resolve() in _claims


def release_claims() -> list[Path]:
    """Lets go of every claimed lock no run took over (a command that ended before it trained), and returns
    their folders."""
    released = []
    while _claims:
        path, (descriptor, _) = _claims.popitem()
        with contextlib.suppress(OSError):
            os.ftruncate(descriptor, 0)  # an empty lock file names nobody
        os.close(descriptor)
        released.append(path.parent)
    return released


def invocations(folder: Path) -> list[dict]:
    """The whole entries (JSON objects) of `folder`'s invocations.jsonl, oldest first. Lines cut short by a kill
    or a full disk, and anything else that is not an entry (a damaged file), are passed over."""
    try:
        lines = (folder / INVOCATIONS).read_text(errors="replace").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


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
        except KeyboardInterrupt:
            status["outcome"] = "interrupted"
            raise
        except BaseException as error:
            status["outcome"] = f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            raise
        finally:
            _record(folder, {"event": "end", "time": _now(), **status, "pid": os.getpid()})
