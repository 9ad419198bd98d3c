"""Errors a user can fix. `run.py` prints them as one line and exits non-zero.

Everything else is a bug and keeps its traceback.
"""

import re


class UserError(Exception):
    """Bad input: the message names the file or config key and what was expected."""


class ConfigError(UserError, ValueError):
    """A config key has a wrong value."""


class DataError(UserError):
    """A data file is missing, malformed or holds an out-of-range value."""


class ClusterError(UserError):
    """A multi-worker run lost a worker or timed out waiting for one."""


class DiskError(UserError):
    """A file could not be written: full disk, quota, read-only or unwritable folder."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or, in a sweep, SIGTERM) stopped a run after saving what it needs to resume; the message says how.
    A `KeyboardInterrupt`, so a sweep stops too; `run.py` prints the message and exits 130, as a shell does after
    Ctrl-C."""


TF_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")  # TensorFlow's prefix: where an op ran
# An eager call of a graph function: "Graph execution error:\n\nDetected at node N defined at (most recent call
# last):\n  File "/abs/path.py", line 1, in f\n ...\n\nTHE REASON\n\t [[{{node N}}]]": the trace and the node go.
GRAPH_TRACE = re.compile(
    r"Graph execution error:\s*(?:Detected at node .*? \(most recent call last\):\s*(?:File [^\n]*\s*)*)*"
)
NODE = re.compile(r"\s*\[\[(?:\{\{[^}]*\}\})+\]\]")  # `[[{{function_node f}}{{node N}}]]`: which op
MAP_PREFIX = re.compile(r"Error in user-defined function passed to \S+ transformation with iterator: \S+: ")


def one_line(error: BaseException) -> str:
    """A user error's message as the one line `run.py` prints: without TensorFlow's `{{function_node ...}}`
    prefix or the escaped quotes of a re-raised TensorFlow message, its whitespace collapsed."""
    text = TF_FUNCTION_NODE.sub("", str(error)).replace("\\'", "'")
    return " ".join(text.split())


def op_error_reason(error: Exception) -> str:
    """The useful part of a TensorFlow `OpError`'s message: the text of our pipeline's assertions or of
    the ValueError of a Python step, else the first 300 characters without TensorFlow's op plumbing."""
    message = getattr(error, "message", None) or str(error)
    assertion = re.search(r"assertion failed: \[(.*)\](?= \[Op:|$)", message, re.M)  # `x[3] is ...` whole
    match = assertion or re.search(r"ValueError: ([^\n]+)", message)
    if match:
        return match.group(1)
    text = MAP_PREFIX.sub("", NODE.sub("", GRAPH_TRACE.sub("", TF_FUNCTION_NODE.sub("", message))))
    text = re.sub(r"\[Op:.*", "", text)
    text = " ".join(text.split())[:300]
    if type(error).__name__ == "DataLossError" and text.startswith("corrupted record at"):
        text += " in a TFRecord file (without a manifest.json beside them, every file is checked at start-up and named)"
    return text
