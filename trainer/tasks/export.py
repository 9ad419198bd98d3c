"""`mode=export`: a trained checkpoint as a TensorFlow Serving-ready SavedModel.

python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/pets [dataset=cats_dogs]
"""

from __future__ import annotations

import logging

from trainer import checkpoints
from trainer.config import Config
from trainer.export import export_serving
from trainer.tasks.data import dataset_preprocess, normalization_for

log = logging.getLogger(__name__)


def export(settings: Config) -> None:
    """Loads `checkpoint` and writes the SavedModel and serving_info.json to `export.dir`."""
    dataset = settings.dataset
    size = dataset_preprocess(dataset).output_size
    model = checkpoints.load(settings.checkpoint, dataset.num_classes, (size, size, 3))
    # ImageNet-weight models always expect caffe preprocessing, whatever model= says now.
    normalization = "caffe" if model.name == "vgg19_imagenet" else normalization_for(dataset, settings.model)
    folder = export_serving(model, settings.export.dir, size, normalization, list(dataset.class_names))
    log.info(
        "Exported %s to %s (input: uint8 images of any size, resized to %d, %s)",
        checkpoints.resolve(settings.checkpoint),
        folder,
        size,
        normalization,
    )
