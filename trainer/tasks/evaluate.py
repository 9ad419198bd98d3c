"""`mode=evaluate` and `mode=predict`: a trained checkpoint on a split, or on new inputs to a CSV.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00 [evaluate.split=val]
    python run.py mode=predict checkpoint=RUN predict.input='photos/*.jpg' predict.output=predictions.csv

Evaluation uses the evaluation pipeline (no augmentation) and dropout off.
Prediction writes one CSV row per input, in input order, skipped files included.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path

import numpy as np

from trainer import checkpoints, distribute
from trainer.config import BinaryDatasetConfig, Config
from trainer.data import predict_inputs
from trainer.errors import ConfigError
from trainer.reports import atomic_path, check_writable, write_json
from trainer.tasks.common import evaluate_checkpoint, run_folder, setup_strategy
from trainer.tasks.data import (
    binary_format,
    dataset_preprocess,
    load_data,
    normalization_for,
    record_spec,
)

log = logging.getLogger(__name__)


def evaluate(settings: Config) -> float:
    """Evaluates `checkpoint` on `evaluate.split`; writes metrics.json and the confusion matrix.

    Returns:
        The accuracy, as a plain float.
    """
    strategy = setup_strategy(settings)
    data = load_data(
        settings.dataset,
        settings.trainer.batch_size,
        settings.seed,
        normalization_for(settings.dataset, settings.model),
        check_val=settings.evaluate.split == "val",
    )
    split = settings.evaluate.split
    with run_folder(settings.output_dir, distribute.is_chief(strategy)) as run_dir:
        with distribute.collective_errors(strategy):
            metrics = evaluate_checkpoint(
                strategy, settings.checkpoint, getattr(data, split), data.class_names, data.input_shape, run_dir, split
            )
        metrics["split"] = split
        write_json(run_dir / "metrics.json", metrics)
    log.info("%s accuracy %.4f, loss %.4f", split, metrics["accuracy"], metrics["loss"])
    return metrics["accuracy"]


def _chunks(settings: Config, kind: str, files: list[Path], root: Path | None):
    dataset = settings.dataset
    preprocess = dataset_preprocess(dataset, normalization_for(dataset, settings.model))
    batch = settings.trainer.batch_size
    binary = isinstance(dataset, BinaryDatasetConfig)
    if binary and kind == "records":
        return predict_inputs.record_chunks(files, binary_format(dataset), preprocess, dataset.num_classes, batch)
    if not binary and kind == "tfrecords":
        return predict_inputs.tfrecord_chunks(files, record_spec(dataset), preprocess, dataset.num_classes, batch)
    if kind != "images":
        raise ConfigError(f"predict.input holds {kind} files, which dataset={dataset.name} does not read")
    return predict_inputs.image_chunks(
        files, root, preprocess, list(dataset.class_names), batch, settings.predict.workers
    )


def predict(settings: Config) -> float | None:
    """Predicts every input of `predict.input` and writes the CSV; prints accuracy for labeled input.

    Returns:
        The accuracy for labeled input, else None.
    """
    if settings.strategy.name == "multi_worker":
        raise ConfigError("mode=predict runs on one machine: use strategy=single or strategy=mirrored")
    class_names = list(settings.dataset.class_names)
    size = dataset_preprocess(settings.dataset).output_size
    output = Path(settings.predict.output or Path(settings.output_dir) / "predictions.csv")
    check_writable(output, "predict.output")
    kind, files, root = predict_inputs.resolve_inputs(settings.predict.input)
    strategy = setup_strategy(settings)
    with strategy.scope():
        model = checkpoints.load(settings.checkpoint, len(class_names), (size, size, 3))
    log.info(
        "Predicting %d %s file(s) from %s with %s",
        len(files),
        kind,
        settings.predict.input,
        checkpoints.resolve(settings.checkpoint),
    )

    header = [
        "id",
        "file",
        "predicted_index",
        "predicted_class",
        *(f"prob_{name}" for name in class_names),
        "true_index",
        "true_class",
        "error",
    ]
    counts = {"rows": 0, "skipped": 0, "labeled": 0, "correct": 0}
    started = last_log = time.monotonic()
    with atomic_path(output) as temporary, open(temporary, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for items, images in _chunks(settings, kind, files, root):
            probabilities = iter(np.asarray(model.predict_on_batch(images)) if images is not None else [])
            for item in items:
                row = [item.id, item.file, "", "", *([""] * len(class_names)), "", "", item.error or ""]
                if item.error is None:
                    probs = next(probabilities)
                    predicted = int(np.argmax(probs))
                    row[2 : 4 + len(class_names)] = [predicted, class_names[predicted], *(f"{p:.8g}" for p in probs)]
                    if item.label is not None:
                        counts["labeled"] += 1
                        counts["correct"] += int(predicted == item.label)
                else:
                    counts["skipped"] += 1
                    log.warning("Skipped %s: %s", item.id, item.error)
                if item.label is not None:
                    row[-3:-1] = [item.label, class_names[item.label]]
                writer.writerow(row)
                counts["rows"] += 1
            if time.monotonic() - last_log > 10:
                last_log = time.monotonic()
                log.info("Predicted %d inputs (%.0f/s)", counts["rows"], counts["rows"] / (last_log - started))

    accuracy = counts["correct"] / counts["labeled"] if counts["labeled"] else None
    summary = {**counts, "accuracy": accuracy, "output": str(output), "checkpoint": str(settings.checkpoint)}
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(settings.output_dir) / "metrics.json", summary)
    log.info("Wrote %d rows (%d skipped) to %s", counts["rows"], counts["skipped"], output)
    if accuracy is not None:
        log.info("Accuracy %.4f on %d labeled inputs", accuracy, counts["labeled"])
    return accuracy
