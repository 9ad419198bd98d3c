"""Every benchmark case by name; each makes its own data under `folder` and measures ours and a baseline side by side.

python -m benchmarks --only cifar_pipeline tfrecord_reader
"""

from __future__ import annotations

from benchmarks import (
    converter,
    demo,
    flops,
    folders,
    fused_optimizer,
    pipelines,
    precision,
    search,
    serving,
    soak,
    sources,
    training,
)
from benchmarks.common import Row

CASES = {
    "cifar_pipeline": pipelines.cifar_pipeline,
    "tfrecord_reader": pipelines.tfrecord_reader,
    "worker_shares": pipelines.worker_shares,
    "trainer_overhead": training.trainer_overhead,
    "model_preprocessing": training.model_preprocessing,
    "input_bound": training.input_bound,
    "augmentation_cost": training.augmentation_cost,
    "data_digest": training.data_digest,
    "folder_pipeline": folders.folder_pipeline,
    "folder_cache": folders.folder_cache,
    "folder_search_decodes": folders.folder_search_decodes,
    "parquet_pipeline": sources.parquet_pipeline,
    "tfds_pipeline": sources.tfds_pipeline,
    "predict_records": sources.predict_records,
    "memory": pipelines.memory,
    "startup": demo.startup,
    "converter": converter.converter,
    "serving": serving.serving,
    "demo": demo.demo,
    "step_flops": flops.step_flops,
    "precision": precision.precision,
    "precision_demo": precision.precision_demo,
    "fused_optimizer": fused_optimizer.fused_optimizer,
    "search_pruning": search.search_pruning,
    "soak": soak.soak,
}

__all__ = ["CASES", "Row"]
