"""`mode=export`: a trained checkpoint as a SavedModel for TensorFlow Serving, ONNX or LiteRT, each checked.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/pets
    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.format=all export.quantize=int8
    python run.py mode=export checkpoint=model.keras export.dir=serving/pets      # a bare .keras file works too

The model carries its preprocessing and class names. The check images are the
test split of the run's dataset (its saved config); where that data does not fit
the model or cannot be read, the check runs on random pixels, with a warning.
`export.quantize=int8` calibrates on the training split and cannot do without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trainer.config.schema import Config
from trainer.data.decode import check_decode
from trainer.errors import DataError
from trainer.evaluation import calibration
from trainer.evaluation.predictions import predict_split
from trainer.models.temperature import with_temperature
from trainer.runs import checkpoints
from trainer.serving import portable
from trainer.serving.bundle import FORMATS, CheckImages, write_export
from trainer.tasks.data import Data, load_data

log = logging.getLogger(__name__)


def _formats(settings: Config) -> list[str]:
    chosen = settings.export.format
    return list(FORMATS) if chosen == "all" else [str(chosen)]


def _first(dataset, count: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels, total = [], [], 0
    for batch_images, batch_labels in dataset:
        images.append(batch_images.numpy())
        labels.append(batch_labels.numpy())
        total += len(images[-1])
        if total >= count:
            break
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def _fitting_data(settings: Config, info: checkpoints.ModelInfo) -> Data | str:
    """The dataset of the run (or of the command line), when it can be read and fits the model; else why not."""
    try:
        check_val = settings.export.temperature == "auto"  # fitted on the validation split
        data = load_data(settings.dataset, settings.trainer.batch_size, settings.seed, check_val=check_val)
        file = checkpoints.resolve(settings.checkpoint)
        checkpoints.check_data(file, info, data.class_names, data.input_shape[0], f"dataset={settings.dataset.name}")
    except DataError as error:
        return str(error)
    return data


def _check_images(settings: Config, info: checkpoints.ModelInfo, data: Data | str) -> CheckImages:
    count = settings.export.check_images
    if isinstance(data, Data):  # as a client sends them: the stored images, which `serve` resizes and crops
        images, labels = _first(data.test_stored, count)
        return CheckImages(images, labels, f"{len(images)} images of the test split of dataset={settings.dataset.name}")
    log.warning("The export is checked on random pixels, not on test images: %s", data)
    size = info.resize_to
    pixels = np.random.default_rng(settings.seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return CheckImages(pixels, None, f"{count} images of random pixels")


def _calibration(settings: Config, data: Data | str) -> np.ndarray | None:
    if settings.export.quantize != "int8":
        return None
    if not isinstance(data, Data):
        raise DataError(f"export.quantize=int8 calibrates on the training split of the run's dataset: {data}")
    images, _ = _first(data.train_plain, settings.export.calibration_images)
    log.info("Calibrating int8 on %d training images <export.calibration_images>", len(images))
    return images


def _temperature(settings: Config, model, data: Data | str) -> float | None:
    """export.temperature: a number, or `auto`: the one of lowest NLL on the run's validation split."""
    chosen = settings.export.temperature
    if chosen != "auto":
        return None if chosen is None else float(chosen)
    if not isinstance(data, Data):
        raise DataError(f"export.temperature=auto fits on the validation split of the run's dataset: {data}")
    if not data.num_examples.get("val"):
        raise DataError("export.temperature=auto fits on the validation split: the run's dataset has none")
    if data.val_is_test:
        raise DataError(
            "export.temperature=auto fits on the validation split, and the run's reads the test records "
            "(dataset.val_source=test): give the temperature by hand, export.temperature=T"
        )
    held_out = predict_split(model, data.val, 0)
    fitted = calibration.fit_temperature(held_out.probabilities, held_out.labels)
    log.info(
        "Temperature %.4f fitted on %d validation images (NLL %.4f -> %.4f) <export.temperature=auto>",
        fitted,
        len(held_out.labels),
        calibration.nll(held_out.probabilities, held_out.labels),
        calibration.nll(held_out.probabilities, held_out.labels, fitted),
    )
    return fitted


def _log_report(serving_info: dict, folder: Path) -> None:
    check = serving_info["check"]
    log.info("Checked on %s against Keras's predict (accuracy %s)", check["source"], _percent(check["keras_accuracy"]))
    for format, entry in serving_info["files"].items():
        for item in (entry, entry.get("quantized")):
            if item:
                log.info(
                    "%s %s: %.2f MB, largest difference from Keras %.2g, accuracy %s",
                    format,
                    folder / item["path"],
                    item["bytes"] / 1e6,
                    item["max_difference"],
                    _percent(item["accuracy"]),
                )


def _percent(value: float | None) -> str:
    return "n/a (random pixels)" if value is None else f"{100 * value:.2f}%"


def export(settings: Config) -> None:
    """Loads `checkpoint`, writes `export.format` into `export.dir` with serving_info.json, each format checked."""
    formats = _formats(settings)
    for format in formats:
        portable.require_extra(format)
    model, info = checkpoints.load(settings.checkpoint)
    check_decode(info.decode, f"checkpoint={settings.checkpoint}")  # serve_bytes decodes as this version does
    data = _fitting_data(settings, info)
    check = _check_images(settings, info, data)
    quantized_on = _calibration(settings, data)
    temperature = _temperature(settings, model, data)
    model = with_temperature(model, temperature)
    export = settings.export
    serving_info = write_export(
        model, info, export.dir, formats, check, str(export.quantize), quantized_on, export.max_pixels, temperature
    )
    log.info(
        "Exported %s to %s as %s (classes %s)",
        checkpoints.resolve(settings.checkpoint),
        settings.export.dir,
        ", ".join(formats),
        list(info.class_names),
    )
    _log_report(serving_info, Path(settings.export.dir))
