"""A model's inference latency as it is served: the exported SavedModel's `serve` at batch 1.

    python run.py -m hparams_search=vgg19_optuna hydra.sweeper.directions=[maximize,minimize] \\
        objective.metrics=[val_accuracy,latency_ms] hydra.sweeper.pruner=null

A search whose `objective.metrics` name `latency_ms` measures it in each trial after
training, on the best checkpoint: the SavedModel `mode=export` writes (into a temporary
folder), loaded with `tf.saved_model.load`, then `WARM_CALLS` calls that are not timed
(tracing, the first allocations) and the median of `TIMED_CALLS` timed calls of one image
of the stored size. A median, because a busy machine's stalls land on a few calls.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from trainer.runs import checkpoints
from trainer.serving.runners import saved_model_runner
from trainer.serving.saved_model import write_saved_model

METRIC = "latency_ms"  # the metrics.json key (objective.metrics=[val_accuracy, latency_ms])
WARM_CALLS = 5  # untimed calls first
TIMED_CALLS = 50  # the median of these
SOURCE = f"SavedModel serve, batch 1, median of {TIMED_CALLS} calls after {WARM_CALLS} warm ones"


def serve_latency_ms(checkpoint: str | Path) -> float:
    """Milliseconds one call of the exported `serve` takes on one uint8 image of the checkpoint's stored size."""
    model, info = checkpoints.load(checkpoint)
    with tempfile.TemporaryDirectory(prefix="vggtrain-latency-") as folder:
        serve = saved_model_runner(write_saved_model(model, Path(folder), info))
        image = np.zeros((1, info.resize_to, info.resize_to, 3), np.uint8)
        for _ in range(WARM_CALLS):
            serve(image)
        times = []
        for _ in range(TIMED_CALLS):
            started = time.perf_counter()
            serve(image)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)
