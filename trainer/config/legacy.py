"""Saved configs of vggtrain 0.1 (run folders made before parts were built from `_target_`), read as today's.

    python run.py mode=evaluate checkpoint=RUN_MADE_WITH_0.1     # its .hydra/config.yaml still loads

Two sections changed shape; each change keeps what the old run did:
- `optimizer` had one schema for every optimizer, whose keys another optimizer ignored
  (Adam never read `momentum`, `nesterov` or `weight_decay`): they are dropped, and the
  option's `_target_` comes from its `name`.
- `logger.tensorboard`, `logger.mlflow` and `logger.wandb` were booleans: `true` is now the
  tracker's entry with its defaults, `false` no entry.

The built-in dataset parts moved to `trainer.data.formats` (each format one file, its keys and its part): a
saved `dataset._target_` of the old place names the same format there.

And `logger.csv`, a flag no code read (`logger=csv` is the option of no tracker), is dropped.
Remove this module in vggtrain 0.2 (docs/development.md, the ledger's row 10): only run folders of
vggtrain 0.1 need it.
"""

from __future__ import annotations

from typing import Any

OPTIMIZER_KEYS = {"momentum": ("sgd",), "nesterov": ("sgd",), "weight_decay": ("adamw",)}  # who read them in 0.1
TRACKERS = ("tensorboard", "mlflow", "wandb")
MOVED_PARTS = {  # dataset._target_ before trainer.data.formats -> now
    "trainer.data.binary_files.BinaryFiles": "trainer.data.formats.binary.BinaryFiles",
    "trainer.data.tfrecord_files.TFRecordFiles": "trainer.data.formats.tfrecord.TFRecordFiles",
    "trainer.data.folder.ImageFolder": "trainer.data.formats.folder.ImageFolder",
    "trainer.data.parquet.ArrowFiles": "trainer.data.formats.parquet.ArrowFiles",
    "trainer.data.tfds_files.TFDSFiles": "trainer.data.formats.tfds.TFDSFiles",
}


def upgrade(saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` (a run's `.hydra/config.yaml` as a dict) in today's shape; a config of today is returned as it is."""
    optimizer = saved.get("optimizer")
    if isinstance(optimizer, dict) and "_target_" not in optimizer:
        name = optimizer.get("name")
        saved["optimizer"] = {
            key: value for key, value in optimizer.items() if name in OPTIMIZER_KEYS.get(key, (name,))
        }
    dataset = saved.get("dataset")
    if isinstance(dataset, dict) and dataset.get("_target_") in MOVED_PARTS:
        dataset["_target_"] = MOVED_PARTS[dataset["_target_"]]
    logger = saved.get("logger")
    if isinstance(logger, dict):
        logger.pop("csv", None)  # a flag no code read
        for key in TRACKERS:
            if isinstance(logger.get(key), bool):
                logger[key] = {} if logger[key] else None
    return saved
