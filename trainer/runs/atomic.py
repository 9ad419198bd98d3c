"""Files a run leaves behind, each written atomically: a temporary file, then a rename; and whole folders
(the evaluation report, an export) the same way.

A kill in the middle of a write leaves the previous file intact (and a `.NAME.tmp-*` file that
the next process holding the run folder's lock removes); a full disk is one `DiskError` line.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainer.errors import DiskError

TEMPORARY_MARK = ".tmp-"  # in the name of every temporary file: `.NAME.tmp-XXXXXXXX.SUFFIXES`


def _create_temporary(path: Path) -> Path:
    """Creates an empty file beside `path`, keeping its suffixes (`.weights.h5`, `.keras`): Keras and
    matplotlib pick the format from them. Created with mode 0666 less the umask (mkstemp's 0600 would
    hide metrics and checkpoints from teammates)."""
    suffixes = "".join(path.suffixes)
    while True:
        temporary = path.parent / f".{path.name}{TEMPORARY_MARK}{secrets.token_hex(4)}{suffixes}"
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return temporary
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path` (same suffixes) and renames it onto `path` on success.

    Raises:
        DiskError: the temporary file cannot be created (full disk, read-only or unwritable folder).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = _create_temporary(path)
    except OSError as error:
        raise DiskError(f"cannot write {path}: {_reason(error)}") from None
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _reason(error: BaseException) -> str:
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    text = " ".join(text.split()) or type(error).__name__  # one line: HDF5's messages span several
    match = re.search(r"error message = '([^']+)'", text)  # HDF5: "... errno = 28, error message = 'No space ..."
    if match:
        return match.group(1)
    return text if len(text) < 200 else text[:200] + "..."


def remove_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files a killed process left in `folder` (call only while holding its lock)."""
    leftovers = [path for path in Path(folder).glob(f".*{TEMPORARY_MARK}*") if path.is_file()]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Calls `write(temporary_path)`, then renames the result onto `path`; nothing is left half-written.

    Raises:
        DiskError: writing failed with an OS error (full disk, quota, permissions); `path` is unchanged.
    """
    with atomic_path(path) as temporary:
        try:
            write(temporary)
        except OSError as error:
            _release_hdf5(temporary)
            kept = "; the previous file is unchanged" if os.path.exists(path) else ""
            raise DiskError(f"cannot write {path}: {_reason(error)}{kept}") from None
    return Path(path)


def _release_hdf5(temporary: Path) -> None:
    """Closes the HDF5 handles a failed `save_weights` left open on `temporary`. Left to the garbage
    collector, h5py flushes them again at interpreter exit, prints a traceback and, on a full disk,
    crashes the process (SIGSEGV) after the one-line error."""
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return
    previous, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None  # the flush fails again: expected
    try:
        # Keras 3.15 leaves it open on a failed write; see h5py/h5py#914 and docs/development.md (workarounds)
        for handle in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
            if Path(os.fsdecode(handle.name)).name == temporary.name:
                with contextlib.suppress(Exception):
                    handle.close()
        gc.collect()
    finally:
        sys.unraisablehook = previous


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Writes `data` as indented JSON, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return write_atomic(path, lambda temporary: temporary.write_text(text))


def leftover_folders(final: str | os.PathLike) -> list[Path]:
    """The temporary folders of `atomic_folder(final)` that a killed process left (remove them only while
    holding the folder's lock)."""
    final = Path(final)
    return [path for path in final.parent.glob(f".{final.name}-*") if path.is_dir()]


@contextlib.contextmanager
def atomic_folder(final: str | os.PathLike, key: str = "", replace: bool = False) -> Iterator[Path]:
    """Yields a new temporary folder `.NAME-XXXXXXXX` beside `final`; renames it onto `final` once the body has
    written it all (an earlier `final` replaced where `replace`), and removes it if the body fails.

    Raises:
        DiskError: the folder or a file in it cannot be written (full disk, permissions): one line naming
            `final` (as `key=final` where a config key chose it).
    """
    final = Path(final)
    named = f"{key}={final}: cannot write it" if key else f"cannot write {final}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as error:
        raise DiskError(f"{named}: {_reason(error)}") from None
    try:
        yield folder
        if replace and final.exists():
            old = final.with_name(f".{final.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            folder.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(folder, final)
    except OSError as error:
        raise DiskError(f"{named}: {_reason(error)}") from None
    except DiskError as error:  # a file of it, named in the temporary folder: name the folder's place
        raise DiskError(str(error).replace(str(folder), str(final))) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
