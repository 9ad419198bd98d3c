"""The evaluation report: why a model is wrong, in `report/` of the run folder.

    python run.py                                        # at the end of training, for the test split
    python run.py mode=evaluate checkpoint=RUN evaluate.split=val [evaluate.tta=flip]
    python run.py ... evaluate.report=false              # none

`report/` holds `report.html` (self-contained: open it offline), `per_class.csv`, `mistakes.png` (the
most confident wrong predictions, each beside its Grad-CAM), `borderline.png` (the least confident
right ones), `calibration.png` (the reliability diagram) and `confusion_matrix.png`. It is written
to a temporary folder beside it, then renamed: never half-written.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer.errors import DataError
from trainer.evaluation import calibration, classes, html
from trainer.evaluation.gradcam import GradCam, overlay
from trainer.evaluation.predictions import Predictions, forward, predict_split
from trainer.runs.atomic import atomic_folder, leftover_folders
from trainer.tracking.reports import plot_confusion_png
from trainer.tracking.sheets import contact_sheet, note_image, save_png

log = logging.getLogger(__name__)

FOLDER = "report"
FILES = ("report.html", "per_class.csv", "mistakes.png", "borderline.png", "calibration.png", "confusion_matrix.png")


@dataclass(frozen=True)
class ReportOptions:
    images: int = 16  # tiles on each sheet (evaluate.report_images)
    cam_layer: str | None = None  # the Grad-CAM layer (evaluate.cam_layer); None: the last convolution block's


def check_classes(labels: np.ndarray, class_names: list[str], split: str) -> None:
    """The report's figures need two classes among `labels` (the `split`'s): training checks before its first
    step, the report again on what it predicted.

    Raises:
        DataError: one class (or none) in the split.
    """
    present = np.unique(labels)
    if len(present) < 2:
        held = f"one class ({class_names[int(present[0])]})" if len(present) else "no labelled example"
        raise DataError(
            f"evaluate.report: the {split} split holds {held}; per-class figures and calibration need two or "
            f"more (evaluate.report=false evaluates without the report)"
        )


def _sheets(predictions: Predictions, cam: GradCam | None, class_names: list[str], split: str) -> list:
    """The mistakes and borderline contact sheets: each image beside its Grad-CAM of the predicted class (one
    Grad-CAM pass for both), or a note where a sheet has nothing to show."""
    groups = [(predictions.mistakes, f"no wrong prediction in the {split} split"),
              (predictions.borderline, f"no right prediction in the {split} split")]  # fmt: skip
    kept = [item for items, _ in groups for item in items]
    indices = np.array([index for index, _ in kept], np.int64)
    images = np.stack([image for _, image in kept]).astype(np.uint8) if kept else None
    tiles = images
    if cam is not None and kept:
        heat = cam(images, predictions.predicted[indices])
        tiles = np.concatenate([images, np.stack([overlay(i, h) for i, h in zip(images, heat, strict=True)])], 2)
    sheets, start = [], 0
    for items, empty in groups:
        if not items:
            sheets.append(note_image(empty))
            continue
        chosen = indices[start : start + len(items)]
        captions = [
            f"{class_names[predictions.labels[i]]}->{class_names[p]} {predictions.probabilities[i, p]:.2f}"
            for i, p in zip(chosen, predictions.predicted[chosen], strict=True)
        ]
        sheets.append(contact_sheet(tiles[start : start + len(items)], captions))
        start += len(items)
    return sheets


def _fit_temperature(model: keras.Model, calibrate_on: tf.data.Dataset, step) -> calibration.TemperatureFit:
    held_out = predict_split(model, calibrate_on, 0, step)
    fit = calibration.fit_checked(held_out.probabilities, held_out.labels)
    if fit.temperature is None or fit.bound is not None:
        log.info("Calibration: the validation split's %s", fit.unfitted or fit.at_bound)
    return fit


def write_report(
    run_dir: Path,
    model: keras.Model,
    cam_model: keras.Model,
    dataset: tf.data.Dataset,
    class_names: list[str],
    split: str,
    options: ReportOptions,
    calibrate_on: tf.data.Dataset | None = None,
) -> dict:
    """Writes `run_dir/report/` for `model` on `dataset` (the `split`); `cam_model` is the same model without
    test-time augmentation; `calibrate_on` (the validation split) fits the temperature.

    Returns:
        The figures for metrics.json: ece, and temperature and ece_scaled when fitted.

    Raises:
        DataError: the split holds one class.
        ConfigError: `options.cam_layer` names no 4-D layer.
    """
    cam = GradCam.build(cam_model, options.cam_layer)
    if cam is None:
        log.warning("Grad-CAM skipped: the model has no 4-D (convolution) layer; the sheets show the images alone")
    step = forward(model)
    predictions = predict_split(model, dataset, options.images, step)
    check_classes(predictions.labels, class_names, split)
    matrix = classes.confusion(predictions.labels, predictions.predicted, len(class_names))
    rows = classes.class_rows(matrix, class_names)
    before = calibration.reliability(predictions.probabilities, predictions.labels)
    fit = _fit_temperature(model, calibrate_on, step) if calibrate_on is not None else None
    temperature = fit.temperature if fit else None
    after = None
    if temperature is not None:
        after = calibration.reliability(calibration.scale(predictions.probabilities, temperature), predictions.labels)
    figures = {"ece": before.ece, **({"temperature": temperature, "ece_scaled": after.ece} if after else {})}
    summary = classes.summary(matrix)
    for stale in leftover_folders(run_dir / FOLDER):  # a report a kill interrupted (the run holds its lock)
        shutil.rmtree(stale, ignore_errors=True)
    with atomic_folder(run_dir / FOLDER, replace=True) as folder:  # a resumed run's earlier report is replaced
        classes.write_class_csv(folder / "per_class.csv", rows)
        mistakes, borderline = _sheets(predictions, cam, class_names, split)
        save_png(mistakes, folder / "mistakes.png")
        save_png(borderline, folder / "borderline.png")
        title = f"{split} split, {calibration.BINS} bins"
        calibration.plot_reliability(folder / "calibration.png", before, after, title)
        drawn = run_dir / f"confusion_matrix_{split}.png"  # the evaluation's, of the same predictions
        if drawn.is_file():
            shutil.copyfile(drawn, folder / "confusion_matrix.png")
        else:
            plot_confusion_png(folder / "confusion_matrix.png", matrix, class_names, f"{split} split")
        page = _page(split, len(predictions.labels), summary, figures, rows, folder, cam, fit)
        (folder / "report.html").write_text(page, encoding="utf-8")
    log.info("Wrote the evaluation report: %s", (run_dir / FOLDER / "report.html").resolve())
    return figures


def _page(split, count, summary, figures, rows, folder: Path, cam: GradCam | None, fit) -> str:
    headline = [
        ("split", split),
        ("examples", str(count)),
        ("accuracy", f"{summary['accuracy']:.4f}"),
        ("balanced accuracy", f"{summary['balanced_accuracy']:.4f}"),
        ("macro F1", f"{summary['macro_f1']:.4f}"),
        ("ECE", f"{figures['ece']:.4f}"),
    ]
    if "temperature" in figures:
        headline += [("temperature", f"{figures['temperature']:.3f}"), ("ECE scaled", f"{figures['ece_scaled']:.4f}")]
    table = (
        ["class", "precision", "recall", "F1", "support", "confused with"],
        [[row["class"], *(f"{row[key]:.4f}" for key in ("precision", "recall", "f1")), str(row["support"]),
          classes.confused_text(row["confused_with"])] for row in rows],
    )  # fmt: skip
    looked = f" Beside each: where the model looked (Grad-CAM at {cam.layer})." if cam else ""
    if fit is None:
        calibrated = " No validation split to fit a temperature on."
    elif fit.temperature is None:
        calibrated = f" No temperature: the validation split's {fit.unfitted}."
    else:
        held = f" ({fit.at_bound})" if fit.bound is not None else ""
        calibrated = (
            f" The temperature {figures['temperature']:.3f}{held}, fitted on the validation split, gives an ECE "
            f"of {figures['ece_scaled']:.4f} (export.temperature=auto bakes it in)."
        )
    sections = [
        ("The worst mistakes", f"The most confident wrong predictions: true -> predicted, probability.{looked}",
         folder / "mistakes.png"),
        ("Borderline", f"The least confident right predictions.{looked}", folder / "borderline.png"),
        ("Calibration", f"Expected calibration error over {calibration.BINS} bins: {figures['ece']:.4f}.{calibrated}",
         folder / "calibration.png"),
        ("Confusion matrix", "Rows: the true class; columns: the predicted class.", folder / "confusion_matrix.png"),
    ]  # fmt: skip
    return html.render(f"Evaluation report: {split} split", headline, sections, table)
