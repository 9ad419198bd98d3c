"""Keeps TensorFlow's start-up noise out of the console and run.log; a setting brings it back.

    python run.py trainer.tf_logs=true              # cuInit, oneDNN, absl and INFO lines as TensorFlow prints them
    python -m trainer.convert IN OUT --tf-logs

Quiet (the default) means: TF_CPP_MIN_LOG_LEVEL=3 for the C++ runtime (the
`failed call to cuInit` and oneDNN lines), the absl lines TensorFlow's import
writes before its logging starts dropped from stderr, and TensorFlow's Python
logger (the mirrored strategy's `Reduce to ... then broadcast` INFO lines) at
WARNING. Errors still reach the user: as Python exceptions, and any other
stderr text of the import is passed through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

ENV = "VGGTRAIN_TF_LOGS"  # "1": show TensorFlow's logs; inherited by worker processes
# Lines the C++ side writes before absl's logging starts: the banner and glog-style `I0000 00:00:...` records.
NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\] "
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags)"
)


def configure(show_logs: bool) -> None:
    """Chooses quiet or TensorFlow's own logs for this process and the processes it starts."""
    os.environ[ENV] = "1" if show_logs else "0"
    if not show_logs:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    elif os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "3":
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"


def showing_logs() -> bool:
    return os.environ.get(ENV) == "1"


def drop_noise(text: str) -> str:
    """`text` without the lines matching NOISE."""
    return "".join(line for line in text.splitlines(keepends=True) if not NOISE.match(line))


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Sends file descriptor 2 (C++ writes included) to a file while the block runs, then writes what
    was not noise to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = drop_noise(capture.read().decode(errors="replace"))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def import_tensorflow() -> ModuleType:
    """Imports TensorFlow as `configure` chose (quiet unless VGGTRAIN_TF_LOGS=1) and returns it."""
    show = showing_logs()
    if not show:
        configure(False)
    if show or "tensorflow" in sys.modules:
        import tensorflow as tf
    else:
        with filtered_stderr():
            import tensorflow as tf
    logging.getLogger("tensorflow").setLevel(logging.INFO if show else logging.WARNING)
    return tf
