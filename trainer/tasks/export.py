"""`mode=export`: a trained checkpoint as a TensorFlow Serving-ready SavedModel.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/pets
    python run.py mode=export checkpoint=model.keras export.dir=serving/pets      # a bare .keras file works too

The model carries its preprocessing and class names, so nothing is taken from the dataset config.
"""

from __future__ import annotations

import logging

from trainer.config.schema import Config
from trainer.models.serving import export_serving
from trainer.runs import checkpoints

log = logging.getLogger(__name__)


def export(settings: Config) -> None:
    """Loads `checkpoint` and writes the SavedModel and serving_info.json to `export.dir`."""
    model, info = checkpoints.load(settings.checkpoint)
    folder = export_serving(model, settings.export.dir, info)
    log.info(
        "Exported %s to %s (input: uint8 images of any size, resized to %d%s; classes %s)",
        checkpoints.resolve(settings.checkpoint),
        folder,
        info.resize_to,
        f", centre-cropped to {info.image_size}" if info.resize_to != info.image_size else "",
        list(info.class_names),
    )
