"""run.log: a disk that fills while the log is written costs the rest of the file, not a traceback per line.

    python run.py       # conf/config.yaml names this handler for Hydra's run.log (hydra.job_logging)

Python's `logging.FileHandler` prints "--- Logging error ---" and a traceback for every line it
cannot write, so on a full disk the one line that says what stopped the run would drown in them.
"""

from __future__ import annotations

import logging
import sys


class RunLog(logging.FileHandler):
    """A `FileHandler` that, on the first line it cannot write (full disk, quota, a file made read-only),
    says so in one warning on stderr and leaves the rest of the log to the console."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = True
        reason = error.strerror or str(error)
        print(
            f"warning: cannot write {self.baseFilename}: {reason}; the rest of the log goes to the console only",
            file=sys.stderr,
            flush=True,
        )
