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


SUMMARIZED = re.compile(r"Summarized data: b(?:'([^']*)'|\"([^\"]*)\")")  # an assertion run eagerly: its message
ASSERTION = re.compile(r"assertion failed: \[(.*)\](?= \[Op:|$)", re.M)  # ... or in a graph: `x[3] is ...` whole
OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\].*|Name: <unknown>, ")  # `[Op:IteratorGetNext] name: ...` and parse_example's


def one_line(error: BaseException) -> str:
    """Any error as the one line we print: the only function that makes one.

    A user error: its message, without TensorFlow's `{{function_node ...}}` prefix or the escaped quotes of a
    re-raised TensorFlow message. A TensorFlow `OpError`: the text of our pipeline's assertions or of a Python
    step's ValueError, else its first 300 characters without TensorFlow's op plumbing (graph trace, node,
    tf.data's map prefix, `[Op:...]`). Anything else (a bug in someone's code): `TypeName: its first line`.
    """
    if isinstance(error, UserError):
        return " ".join(TF_FUNCTION_NODE.sub("", str(error)).replace("\\'", "'").split())
    message = getattr(error, "message", None)
    if message is None or not hasattr(error, "node_def"):  # not a TensorFlow OpError
        cause = error.__cause__ or error
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
    match = SUMMARIZED.search(message) or ASSERTION.search(message) or re.search(r"ValueError: ([^\n]+)", message)
    if match:  # a graph assertion escapes the quotes of its string
        return next(group for group in match.groups() if group is not None).replace("\\'", "'")
    text = MAP_PREFIX.sub("", NODE.sub("", GRAPH_TRACE.sub("", TF_FUNCTION_NODE.sub("", message))))
    text = " ".join(OP_SUFFIX.sub("", text).split())[:300]
    return text or type(error).__name__
