"""`mode=export`: a trained checkpoint as a SavedModel for TensorFlow Serving, ONNX, LiteRT or OpenVINO, each
checked, with a model card.

    python run.py mode=export checkpoint=outputs/2026-11-30/12-00-00 export.dir=serving/pets
    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.format=all export.quantize=int8
    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.embeddings=true
    python run.py mode=export checkpoint=model.keras export.dir=serving/pets      # a bare .keras file works too
    AIP_MODEL_DIR=gs://b/job/model python run.py mode=export checkpoint=RUN      # Vertex AI's model folder

The model carries its preprocessing and class names. The check images are the
test split of the run's dataset (its saved config); where that data does not fit
the model or cannot be read, the check runs on random pixels, with a warning.
`export.quantize=int8` calibrates on the training split and cannot do without it; the check
images, held out from that, measure how often it keeps the float model's top-1 class.
MODEL_CARD.md is written from the run folder (`trainer/serving/model_card.py`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from trainer.config.reuse import run_folder_of
from trainer.config.schema import Config
from trainer.data.decode import check_decode
from trainer.data.module import DataModule
from trainer.errors import DataError
from trainer.evaluation import calibration
from trainer.evaluation.predictions import predict_split
from trainer.runs import checkpoints, storage
from trainer.serving import embeddings, model_card, portable
from trainer.serving.bundle import FORMATS, INFO_FILE, CheckImages, ExportOptions, write_export
from trainer.tasks.data import load_data

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


def _fitting_data(settings: Config, info: checkpoints.ModelInfo) -> DataModule | str:
    """The dataset of the run (or of the command line), when it can be read and fits the model; else why not."""
    try:
        check_val = settings.export.temperature == "auto"  # fitted on the validation split
        reads = ("test", *(["val"] if check_val else []), *(["train"] if settings.export.quantize == "int8" else []))
        data = load_data(settings.dataset, settings.trainer.batch_size, settings.seed, check_val=check_val, reads=reads)
        file = checkpoints.resolve(settings.checkpoint)
        checkpoints.check_data(file, info, data.class_names, data.input_shape[0], f"dataset={settings.dataset.name}")
    except DataError as error:
        return str(error)
    return data


def _check_images(settings: Config, info: checkpoints.ModelInfo, data: DataModule | str) -> CheckImages:
    count = settings.export.check_images
    if isinstance(data, DataModule):  # as a client sends them: the stored images, which `serve` resizes and crops
        images, labels = _first(data.split("test", stored=True), count)
        return CheckImages(images, labels, f"{len(images)} images of the test split of dataset={settings.dataset.name}")
    log.warning("The export is checked on random pixels, not on test images: %s", data)
    size = info.resize_to
    pixels = np.random.default_rng(settings.seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return CheckImages(pixels, None, f"{count} images of random pixels")


def _calibration(settings: Config, data: DataModule | str) -> np.ndarray | None:
    if settings.export.quantize != "int8":
        return None
    if not isinstance(data, DataModule):
        raise DataError(f"export.quantize=int8 calibrates on the training split of the run's dataset: {data}")
    images, _ = _first(data.split("train"), settings.export.calibration_images)
    log.info("Calibrating int8 on %d training images <export.calibration_images>", len(images))
    return images


def _temperature(settings: Config, model, data: DataModule | str) -> float | None:
    """export.temperature: a number, or `auto`: the one of lowest NLL on the run's validation split."""
    chosen = settings.export.temperature
    if chosen != "auto":
        return None if chosen is None else float(chosen)
    if not isinstance(data, DataModule):
        raise DataError(f"export.temperature=auto fits on the validation split of the run's dataset: {data}")
    if not data.num_examples.get("val"):
        raise DataError("export.temperature=auto fits on the validation split: the run's dataset has none")
    if data.val_is_test:
        raise DataError(
            "export.temperature=auto fits on the validation split, and the run's reads the test records "
            "(dataset.val_source=test): give the temperature by hand, export.temperature=T"
        )
    held_out = predict_split(model, data.split("val"), 0)
    fit = calibration.fit_checked(held_out.probabilities, held_out.labels)
    if fit.temperature is None:  # never bake in a temperature the split cannot tell
        raise DataError(
            f"export.temperature=auto: the validation split's {fit.unfitted}; give the temperature by hand "
            f"(export.temperature=T) or none (export.temperature=null)"
        )
    if fit.bound is not None:
        log.warning("export.temperature=auto: %s", fit.at_bound)
    log.info(
        "Temperature %.4f fitted on %d validation images, %d mistakes (NLL %.4f -> %.4f) <export.temperature=auto>",
        fit.temperature,
        fit.examples,
        fit.mistakes,
        calibration.nll(held_out.probabilities, held_out.labels),
        calibration.nll(held_out.probabilities, held_out.labels, fit.temperature),
    )
    return fit.temperature


def _log_export(settings: Config, serving_info: dict, folder: str) -> None:
    log.info(
        "Exported %s to %s as %s (classes %s)",
        checkpoints.resolve(settings.checkpoint),
        folder,
        ", ".join(serving_info["files"]),
        serving_info["class_names"],
    )
    check = serving_info["check"]
    log.info("Checked on %s against Keras's predict (accuracy %s)", check["source"], _percent(check["keras_accuracy"]))
    for format, entry in serving_info["files"].items():
        for item in (entry, entry.get("quantized")):
            if item:
                log.info(
                    "%s %s: %.2f MB, largest difference from Keras %.2g, accuracy %s",
                    format,
                    folder if item["path"] == "." else storage.join(folder, item["path"]),
                    item["bytes"] / 1e6,
                    item["max_difference"],
                    _percent(item["accuracy"]),
                )
    quantized = serving_info["files"].get("litert", {}).get("quantized")
    if quantized:
        log.info(
            "%s keeps the float model's top-1 class on %d of %d check images <export.int8_min_agreement>",
            quantized["path"],
            quantized["agreeing_images"],
            quantized["images"],
        )


def _percent(value: float | None) -> str:
    return "n/a (random pixels)" if value is None else f"{100 * value:.2f}%"


def _write(settings: Config, export_dir: Path) -> dict:
    """Loads `checkpoint`, writes `export.format` into the new local folder `export_dir` with serving_info.json
    and MODEL_CARD.md, each format checked. Returns serving_info.json's content."""
    formats, checkpoint = _formats(settings), settings.checkpoint
    for format in formats:
        portable.require_extra(format)
    if export_dir.exists():  # before the model and the data are read (write_export refuses it again)
        raise DataError(f"export.dir={export_dir}: already exists; choose a new folder (nothing is overwritten)")
    checkpoints.info_of(checkpoint)  # a bad checkpoint= is one line before the model is built
    model, info = checkpoints.load(checkpoint)
    check_decode(info.decode, f"checkpoint={checkpoint}")  # serve_bytes decodes as this version does
    export = settings.export
    if export.embeddings:  # before any data is read: a model without a layer to read is one line
        embeddings.embedding_model(model)
    data = _fitting_data(settings, info)
    check = _check_images(settings, info, data)
    run = model_card.read_run(run_folder_of(checkpoint))  # the card comes from the run folder alone
    options = ExportOptions(
        quantize=str(export.quantize),
        calibration=_calibration(settings, data),
        integer_io=export.integer_io,
        int8_min_agreement=export.int8_min_agreement,
        max_pixels=export.max_pixels,
        temperature=_temperature(settings, model, data),
        embeddings=export.embeddings,
        model_card=lambda serving_info: model_card.render(serving_info, run),
    )
    return write_export(model, info, export_dir, formats, check, options)


def export_to_model_dir(settings: Config, checkpoint: str, model_dir: str) -> None:
    """The checked export of `checkpoint` into Vertex AI's `AIP_MODEL_DIR` (any tf.io.gfile folder): the
    SavedModel's files at its top (`saved_model.pb`, as Vertex AI's prediction containers read it), the other
    formats and serving_info.json beside them. Written locally first, so a failed check leaves nothing there.

    Raises:
        DataError: the folder holds a SavedModel already (nothing is overwritten).
        DiskError: the folder cannot be written.
    """
    settings = dataclasses.replace(settings, checkpoint=checkpoint)
    storage.check_no_saved_model(model_dir, "AIP_MODEL_DIR")
    with tempfile.TemporaryDirectory(prefix="vggtrain-export-") as temporary:
        local = Path(temporary) / "export"
        serving_info = _write(settings, local)
        saved = serving_info["files"].get("saved_model")
        if saved:  # its version folder's files go to the top; serving_info.json says so
            version = local / saved["path"]
            saved["path"] = "."
            (local / INFO_FILE).write_text(json.dumps(serving_info, indent=2) + "\n")
            storage.copy_tree(version, model_dir, "AIP_MODEL_DIR")
            shutil.rmtree(version)
        storage.copy_tree(local, model_dir, "AIP_MODEL_DIR")
    _log_export(settings, serving_info, model_dir)


def export(settings: Config) -> None:
    """Writes `export.format` of `checkpoint` into `export.dir` (or, when that is not given, Vertex AI's
    AIP_MODEL_DIR) with serving_info.json, each format checked."""
    if settings.export.dir:
        _log_export(settings, _write(settings, Path(settings.export.dir)), settings.export.dir)
    else:
        export_to_model_dir(settings, settings.checkpoint, os.environ["AIP_MODEL_DIR"])  # the schema checked it
