"""What goes wrong while replicas train together, as one line: a lost worker, a timed-out collective,
a check failing inside the input pipeline.

    TF_CONFIG=... python run.py strategy=multi_worker strategy.timeout_seconds=60
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from trainer.errors import ClusterError, DataError, op_error_reason


@contextlib.contextmanager
def collective_errors(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Turns a lost worker or a collective timeout into one clear `ClusterError`, and a check failing
    inside the input pipeline (a bad label, a corrupted record) into a `DataError`."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
        raise DataError(f"bad input data: {op_error_reason(error)}") from None
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as error:
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise
        reason = " ".join(str(error.message).split())[:300]
        raise ClusterError(
            f"strategy=multi_worker: a worker stopped responding or a collective timed out "
            f"(strategy.timeout_seconds); restart every worker with the same command. Cause: {reason}"
        ) from None
