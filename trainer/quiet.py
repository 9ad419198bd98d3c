"""Keeps TensorFlow's start-up noise out of the console and run.log (a setting brings it back), and its import short.

    python run.py trainer.tf_logs=true              # cuInit, oneDNN, absl and INFO lines as TensorFlow prints them
    python -m trainer.convert IN OUT --tf-logs

Quiet (the default) means: TF_CPP_MIN_LOG_LEVEL=3 for the C++ runtime (the
`failed call to cuInit` and oneDNN lines), the absl lines TensorFlow's import
writes before its logging starts dropped from stderr, and TensorFlow's Python
logger (the mirrored strategy's `Reduce to ... then broadcast` INFO lines) at
WARNING. Errors still reach the user: as Python exceptions, and any other
stderr text of the import is passed through.

The first import of TensorFlow and Keras runs with Python's cyclic garbage
collector paused (`collector_paused`): it makes about 800,000 objects and
no garbage, and the collector's full passes over them were a fifth of the
import (0.8 s of 4 s here; `python -m benchmarks --only startup`).
"""

from __future__ import annotations

import contextlib
import gc
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


# What libjpeg and libpng write straight to stderr for a corrupt file (`Input file read error`, twice: the pipeline's
# decode and the eager one that finds the reason); the reason is in the skip line already.
IMAGE_LIBRARIES = re.compile(
    r"^(Premature end of JPEG file|Input file read error|Corrupt JPEG data: .*|Unsupported marker type 0x\w+"
    r"|Improper call to JPEG library in state \d+|Invalid JPEG file structure: .*|Not a JPEG file: starts with .*"
    r"|Bogus .*|(Huffman|Quantization) table 0x\w+ was not defined|Unsupported JPEG process: .*"
    r"|Empty JPEG image \(DNL not supported\)|Invalid SOS parameters for sequential JPEG"
    r"|Inconsistent progression sequence for component \d+ coefficient \d+|libpng (warning|error): .*)\s*$"
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


def drop_noise(text: str, *more: re.Pattern) -> str:
    """`text` without the lines matching NOISE (or one of `more`)."""
    patterns = (NOISE, *more)
    return "".join(
        line for line in text.splitlines(keepends=True) if not any(pattern.match(line) for pattern in patterns)
    )


def image_library_messages() -> contextlib.AbstractContextManager:
    """Around a decode of many files: libjpeg's and libpng's own lines for a bad file are dropped (the caller
    names the file and the reason); everything else written to stderr meanwhile comes out after the block."""
    return contextlib.nullcontext() if showing_logs() else filtered_stderr(IMAGE_LIBRARIES)


@contextlib.contextmanager
def filtered_stderr(*more: re.Pattern) -> Iterator[None]:
    """Sends file descriptor 2 (C++ writes included) to a file while the block runs, then writes what
    was not noise (NOISE, nor one of `more`) to stderr."""
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
            kept = drop_noise(capture.read().decode(errors="replace"), *more)
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Runs the block with the cyclic garbage collector off, then moves every object alive to the collector's
    permanent generation (`gc.freeze`): later collections, in the tracing of the first step too, no longer walk
    the modules' objects. For an import that makes objects meant to live as long as the process, and no
    garbage cycles; the garbage made before it is collected first, so none is kept. A collector already off (a
    caller's choice) stays off."""
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


def import_tensorflow() -> ModuleType:
    """Imports TensorFlow and Keras as `configure` chose (quiet unless VGGTRAIN_TF_LOGS=1), the first time with
    the collector paused (`collector_paused`), and returns TensorFlow."""
    show = showing_logs()
    if not show:
        configure(False)
    if "tensorflow" in sys.modules:
        import tensorflow as tf
    else:
        with collector_paused(), contextlib.nullcontext() if show else filtered_stderr():
            import keras  # noqa: F401  (every task's next import: made in the same pause)
            import tensorflow as tf
    logging.getLogger("tensorflow").setLevel(logging.INFO if show else logging.WARNING)
    return tf
