"""A full disk without root: the file-writing layer raises ENOSPC at a chosen byte of a chosen file.

    with DiskFull(run_dir, "history.csv", write=2, at_byte=100) as disk:   # history.csv's second write fills it
        result = run_cli(arguments)
    assert disk.hit == run_dir / ".history.csv.tmp-..."                      # where the disk filled

Every file a run writes from Python goes through `open` (Keras's `.keras` zip, NumPy's `.npz`, Pillow's PNG,
`json`, `csv`, `logging`, Hydra's `.hydra/`) and its writes or `os.sendfile` (`shutil.copyfile`), so patching
those two reaches each of them; the test names the file
by the name it keeps in the run folder (a temporary `.NAME.tmp-XXXXXXXX.SUFFIX` counts as NAME). Once the
chosen byte is written, the disk stays full for every file of the run folder, as a real one does, until the
block ends. Only a mounted tmpfs shows what C++ writes (TensorFlow's event files) and what the kernel does.
"""

from __future__ import annotations

import builtins
import errno
import fnmatch
import io
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-[0-9a-f]{8}(\.[^/]*)?$")
VARYING = (  # parts of a name that change from run to run or epoch to epoch, shown as `*`
    (re.compile(r"epoch\d+-step\d+-[0-9a-f]+"), "*"),
    (re.compile(r"pending-epoch\d+"), "pending-*"),
    (re.compile(r"events\.out\.tfevents\..*"), "events.out.tfevents.*"),
    (re.compile(r"^\.report-[^/]+/"), "report/"),  # the report's temporary folder, renamed once complete
)
WRITING = set("wax+")


def logical_name(path: Path, run_dir: Path) -> str:
    """The name a written file keeps in the run folder, relative to it: `checkpoints/last.keras` for its
    temporary `checkpoints/.last.keras.tmp-1a2b3c4d.keras`; run-varying parts as `*`."""
    relative = path.relative_to(run_dir)
    match = TEMPORARY.match(relative.name)
    name = str(relative.with_name(match["name"])) if match else str(relative)
    for pattern, shown in VARYING:
        name = pattern.sub(shown, name)
    return name


class _Full:
    """A file open for writing on the disk `disk`: its writes fail once the disk is full."""

    def __init__(self, file: Any, disk: DiskFull, path: Path, failing: bool) -> None:
        self._file, self._disk, self._path, self._failing, self._written = file, disk, path, failing, 0
        disk.descriptors[file.fileno()] = self  # shutil.copyfile writes through os.sendfile

    def write(self, data: Any) -> int:
        size = len(data.encode() if isinstance(data, str) else data)
        return self.account(size, lambda part: self._file.write(data[:part]))

    def account(self, size: int, write: Callable[[int], Any]) -> Any:
        """Calls `write(size)`, or fills the disk: `write(what fits)`, then ENOSPC (the next writes too)."""
        if self._disk.hit is None and self._failing and self._written + size > self._disk.at_byte:
            room = self._disk.at_byte - self._written
            if room > 0:  # what fitted reaches the file, as on a real disk
                write(room)
            self._disk.hit = self._path
        if self._disk.hit is not None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._written += size
        return write(size)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __enter__(self) -> _Full:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()

    def __iter__(self):
        return iter(self._file)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class DiskFull:
    """Patches `open` (and `os.sendfile`) so that the `write`-th opening for writing of the run-folder file named
    `name` (a glob on `logical_name`) fills the disk after `at_byte` bytes; `write=0` fills nothing and only records.

    Attributes:
        hit: the file being written when the disk filled; None while it has room.
        before: the content `name` had in the run folder just before the failing write (None: no such file).
        opened: how many times each logical name was opened for writing.
    """

    def __init__(self, run_dir: Path, name: str = "", write: int = 0, at_byte: int = 0) -> None:
        self.run_dir, self.name, self.write, self.at_byte = Path(run_dir).resolve(), name, write, at_byte
        self.hit: Path | None = None
        self.before: bytes | None = None
        self.opened: Counter[str] = Counter()
        self.descriptors: dict[int, _Full] = {}
        self._original, self._sendfile = builtins.open, os.sendfile

    def _open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = self._original(file, mode, *args, **kwargs)
        if not isinstance(file, str | bytes | os.PathLike) or not WRITING & set(mode):
            return opened
        path = Path(os.fsdecode(file)).resolve()
        if not path.is_relative_to(self.run_dir):
            return opened
        name = logical_name(path, self.run_dir)
        self.opened[name] += 1
        failing = bool(self.write) and fnmatch.fnmatch(name, self.name) and self.opened[name] == self.write
        if failing:
            kept = self.run_dir / name
            self.before = kept.read_bytes() if "*" not in name and kept.is_file() else None
        return _Full(opened, self, path, failing)

    def _send(self, out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        file = self.descriptors.get(out_fd)
        if file is None or file.closed:
            return self._sendfile(out_fd, in_fd, offset, count)
        return file.account(count, lambda part: self._sendfile(out_fd, in_fd, offset, part))

    def __enter__(self) -> DiskFull:
        builtins.open = io.open = self._open
        os.sendfile = self._send
        return self

    def __exit__(self, *exc: Any) -> None:
        builtins.open = io.open = self._original
        os.sendfile = self._sendfile
