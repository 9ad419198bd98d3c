"""Errors a user can fix. `run.py` prints them as one line and exits non-zero.

Everything else is a bug and keeps its traceback.
"""


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
