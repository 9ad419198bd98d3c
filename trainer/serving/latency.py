"""A model's inference latency as it is served: the exported SavedModel's `serve` at batch 1.

    python run.py -m hparams_search=vgg19_optuna hydra.sweeper.directions=[maximize,minimize] \\
        objective.metrics=[val_accuracy,latency_ms] hydra.sweeper.pruner=null

A search whose `objective.metrics` name `latency_ms` measures it in each trial after
training, on the best checkpoint: the SavedModel `mode=export` writes (into a temporary
folder), loaded with `tf.saved_model.load`, then `WARM_CALLS` calls that are not timed
(tracing, the first allocations) and the median of `TIMED_CALLS` timed calls of one image
of the stored size. A median, because a busy machine's stalls land on a few calls.
Before any trial the sweeper serves the configured model once, untrained, the same way
(`check_servable`): a model that cannot be exported is one line, not a failure per trial.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import keras
import numpy as np

from trainer.models.preprocessing import build_models
from trainer.runs import checkpoints
from trainer.serving.runners import saved_model_runner
from trainer.serving.saved_model import write_saved_model

METRIC = "latency_ms"  # the metrics.json key (objective.metrics=[val_accuracy, latency_ms])
WARM_CALLS = 5  # untimed calls first
TIMED_CALLS = 50  # the median of these
SOURCE = f"SavedModel serve, batch 1, median of {TIMED_CALLS} calls after {WARM_CALLS} warm ones"


@contextlib.contextmanager
def _served(checkpoint: str | Path) -> Iterator[tuple[Callable, np.ndarray]]:
    """(the checkpoint's exported `serve`, loaded back, one uint8 image of its stored size) while in the block."""
    model, info = checkpoints.load(checkpoint)
    with tempfile.TemporaryDirectory(prefix="vggtrain-latency-") as folder:
        serve = saved_model_runner(write_saved_model(model, Path(folder), info))
        yield serve, np.zeros((1, info.resize_to, info.resize_to, 3), np.uint8)


def serve_latency_ms(checkpoint: str | Path) -> float:
    """Milliseconds one call of the exported `serve` takes on one uint8 image of the checkpoint's stored size."""
    with _served(checkpoint) as (serve, image):
        for _ in range(WARM_CALLS):
            serve(image)
        times = []
        for _ in range(TIMED_CALLS):
            started = time.perf_counter()
            serve(image)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def check_servable(network: keras.Model) -> None:
    """Serves `network` (float images in, probabilities out, untrained) once as a trial's latency is measured: saved
    as a checkpoint and loaded back (Keras's safe mode), exported as the SavedModel, `serve` called on one image.

    Raises:
        Exception: whatever stops one of these steps (the caller words it in one line).
    """
    side, classes = network.input_shape[1], network.output_shape[-1]
    info = checkpoints.ModelInfo(tuple(str(index) for index in range(classes)), side, side, "none")
    with tempfile.TemporaryDirectory(prefix="vggtrain-servable-") as folder:
        checkpoint = Path(folder) / "untrained.keras"
        checkpoints.save(build_models(network, "none").inference, checkpoint, info)
        with _served(checkpoint) as (serve, image):
            serve(image)
