"""Class weights (`trainer.class_weight`): fit's `class_weight`, or with MixUp/CutMix each image's sample weight.

    python run.py trainer.class_weight=balanced                                 # fit's class_weight
    python run.py trainer.class_weight=balanced dataset.augment.mixup_alpha=0.2  # a sample weight per mixed image

With mixed labels, fit's `class_weight` would weigh a soft label by its largest share alone;
the pipeline weighs each image by its soft label's weighted mean instead.
"""

from __future__ import annotations

import logging

from trainer.config.schema import Config
from trainer.data.mixing import with_class_weights
from trainer.data.module import DataModule
from trainer.training.losses import class_weights, count_labels

log = logging.getLogger(__name__)


def weighted_training_data(settings: Config, data: DataModule, weights: dict[int, float] | None, start_batch: int = 0):
    """(the training dataset from batch `start_batch` of its stream on, its per-worker builder, fit's
    `class_weight`): with MixUp or CutMix, class weights become each image's sample weight in the pipeline (its
    soft label's weighted mean), not `class_weight`, which would weigh a soft label by its largest share alone."""
    train = data.train(start_batch)
    for_worker = (lambda context: data.train(start_batch, context)) if data.num_workers > 1 else None
    if weights is None or not settings.dataset.augment.mixing:
        return train, for_worker, weights
    train = with_class_weights(train, weights)
    if for_worker is not None:
        build = for_worker
        for_worker = lambda context: with_class_weights(build(context), weights)  # noqa: E731
    return train, for_worker, None


def class_weight(settings: Config, data: DataModule) -> dict[int, float] | None:
    """`trainer.class_weight` as fit's argument; `balanced` counts the training split (manifest, else the data)."""
    option = settings.trainer.class_weight
    counts = None
    if option == "balanced":
        known = (data.class_counts or {}).get("train")
        if known and set(known) == set(data.class_names):
            counts = [int(known[name]) for name in data.class_names]
        else:
            counts = count_labels(data.split("train"), len(data.class_names))
    weights = class_weights(option, counts, len(data.class_names))
    if weights is not None:
        shown = ", ".join(f"{index}: {weight:.3g}" for index, weight in weights.items())
        log.info("Class weights {%s} <trainer.class_weight=%s>", shown, "balanced" if option == "balanced" else "{...}")
    return weights
