"""`mode=predict`: a trained checkpoint on new inputs, one CSV row per input, in input order.

    python run.py mode=predict checkpoint=RUN predict.input='photos/*.jpg' predict.output=predictions.csv
    python run.py mode=predict checkpoint=RUN predict.input='records/test.tfrecords_*'
    python run.py mode=predict checkpoint=RUN predict.input=photos/ predict.embeddings=true   # + embeddings.npy

Inputs are prepared as the model was evaluated in training (its own resize and centre
crop, from the checkpoint); skipped files get their row with the reason.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path

import numpy as np

from trainer.config.schema import Config
from trainer.data import predict_inputs, tfrecords
from trainer.data.decode import check_decode
from trainer.data.preprocess import Preprocess
from trainer.data.tfrecord_files import CLASSIC_CLASSES
from trainer.errors import ConfigError, DataError
from trainer.models.tta import with_tta
from trainer.runs import checkpoints
from trainer.runs.atomic import atomic_path, write_json
from trainer.runs.outputs import check_prediction_output
from trainer.runs.spreadsheet import safe_row
from trainer.serving import embeddings
from trainer.tasks.data import build_part
from trainer.tasks.runtime import setup_strategy

log = logging.getLogger(__name__)


def _text(name: object) -> str:
    """A file name as CSV text: bytes that are not UTF-8 (a name like `caf\\xe9.png`, read by the OS as surrogate
    escapes) become backslash escapes, as the converter writes them."""
    return str(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _record_class_names(settings: Config, kind: str, files: list[Path], model_classes: list[str]) -> list[str]:
    """The class names that the labels of record files index: the converter's manifest's; the model's for a
    converted folder without labels (nothing to check); Parquet's ClassLabel, else the dataset's, else the
    model's; else the dataset's, else the classic files' two."""
    if kind == "parquet":
        from trainer.data.parquet_rows import class_label_names, file_kind

        label = settings.dataset.label_column
        found = class_label_names(Path(files[0]), file_kind([str(file) for file in files]), label)
        return found or list(settings.dataset.class_names or model_classes)
    _, manifest = tfrecords.read_manifest([str(file) for file in files])
    if manifest is not None:
        return list(manifest.get("class_names") or model_classes)
    return list(getattr(settings.dataset, "class_names", None) or CLASSIC_CLASSES)


def _chunks(settings: Config, info: checkpoints.ModelInfo, kind: str, files: list[Path], root: Path | None):
    """The inputs in order, prepared as the model was evaluated in training (its resize and centre crop)."""
    dataset = settings.dataset
    preprocess = Preprocess.for_evaluation(info.resize_to, info.image_size)
    batch = settings.trainer.batch_size
    num_classes = len(info.class_names)
    if kind != "images":
        chunks = getattr(build_part(dataset), "predict_chunks", lambda *_: None)(
            kind, files, preprocess, num_classes, batch
        )
        if chunks is None:
            raise ConfigError(f"predict.input holds {kind} files, which dataset={dataset.name} does not read")
        checkpoints.check_data(
            checkpoints.resolve(settings.checkpoint),
            info,
            _record_class_names(settings, kind, files, list(info.class_names)),
            info.image_size,
            f"predict.input ({kind} of dataset={dataset.name})",
        )
        return chunks
    return predict_inputs.image_chunks(
        files, root, preprocess, list(info.class_names), batch, info.resize_mode, settings.predict.workers
    )


def predict(settings: Config) -> float | None:
    """Predicts every input of `predict.input` and writes the CSV; prints accuracy for labeled input.

    Returns:
        The accuracy for labeled input, else None.
    """
    if settings.strategy.SPANS_WORKERS:
        raise ConfigError("mode=predict runs on one machine: use strategy=single or strategy=mirrored")
    output = Path(settings.predict.output or Path(settings.output_dir) / "predictions.csv")
    check_prediction_output(output)  # before predicting: a checkpoint or folder is never replaced
    embeddings_path = embeddings.embeddings_file(output) if settings.predict.embeddings else None
    kind, files, root = predict_inputs.resolve_inputs(settings.predict.input, settings.predict.format)
    strategy = setup_strategy(settings)
    with strategy.scope():
        model, info = checkpoints.load(settings.checkpoint)
        check_decode(info.decode, f"checkpoint={settings.checkpoint}")
        model = with_tta(model, settings.predict.tta)
        if settings.predict.embeddings:  # one pass, two outputs: [probabilities, embeddings]
            model = embeddings.with_embeddings(model, key="predict.embeddings")
    vectors = embeddings.EmbeddingRows() if settings.predict.embeddings else None
    class_names = list(info.class_names)  # the model's, whatever the dataset config says
    log.info(
        "Predicting %d %s file(s) from %s with %s%s",
        len(files),
        kind,
        settings.predict.input,
        checkpoints.resolve(settings.checkpoint),
        " and flip TTA <predict.tta=flip>" if settings.predict.tta == "flip" else "",
    )

    top_k = settings.predict.top_k
    if top_k > len(class_names):
        raise ConfigError(f"predict.top_k={top_k}: the model has {len(class_names)} classes; choose at most that")
    ranked = [column for rank in range(1, top_k + 1) for column in (f"top{rank}_class", f"top{rank}_prob")]
    header = [
        "id",
        "file",
        "predicted_index",
        "predicted_class",
        *(f"prob_{name}" for name in class_names),
        *ranked,
        "true_index",
        "true_class",
        "error",
    ]
    scores = 4 + len(class_names) + len(ranked)  # the columns a prediction fills
    counts = {"rows": 0, "skipped": 0, "labeled": 0, "correct": 0}
    unread = []  # the rows of corrupted frames: the rest of each one's file could not be read
    started = last_log = time.monotonic()
    with atomic_path(output) as temporary, open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(safe_row(header))
        for items, images in _chunks(settings, info, kind, files, root):
            outputs = model.predict_on_batch(images) if images is not None else None
            if vectors:  # the embeddings kept, the probabilities on
                outputs = vectors.add(outputs, [item.error is not None for item in items])
            probabilities = iter(np.asarray(outputs) if outputs is not None else [])
            for item in items:
                row = [_text(item.id), _text(item.file), *([""] * (scores - 2)), "", "", item.error or ""]
                if item.error is None:
                    probs = next(probabilities)
                    predicted = int(np.argmax(probs))
                    best = np.argsort(-probs, kind="stable")[:top_k]
                    row[2:scores] = [predicted, class_names[predicted], *(f"{p:.8g}" for p in probs),
                                     *(cell for i in best for cell in (class_names[i], f"{probs[i]:.8g}"))]  # fmt: skip
                    if item.label is not None:
                        counts["labeled"] += 1
                        counts["correct"] += int(predicted == item.label)
                else:
                    counts["skipped"] += 1
                    log.warning("Skipped %s: %s", _text(item.id), item.error)
                    if item.rest_unread:
                        unread.append(item.error)
                if item.label is not None:
                    row[-3:-1] = [item.label, class_names[item.label]]
                writer.writerow(safe_row(row))
                counts["rows"] += 1
            if time.monotonic() - last_log > 10:
                last_log = time.monotonic()
                log.info("Predicted %d inputs (%.0f/s)", counts["rows"], counts["rows"] / (last_log - started))

    if vectors:
        vectors.write(embeddings_path)
        log.info("Wrote the embeddings of %d rows to %s <predict.embeddings>", counts["rows"], embeddings_path)
    accuracy = counts["correct"] / counts["labeled"] if counts["labeled"] else None
    summary = {**counts, "accuracy": accuracy, "output": str(output), "checkpoint": str(settings.checkpoint)}
    summary["unread"] = unread
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(settings.output_dir) / "metrics.json", summary)
    log.info("Wrote %d rows (%d skipped) to %s", counts["rows"], counts["skipped"], output)
    if accuracy is not None:
        log.info("Accuracy %.4f on %d labeled inputs", accuracy, counts["labeled"])
    _refuse_unread(unread, counts["rows"], output)
    return accuracy


def _refuse_unread(unread: list[str], rows: int, output: Path) -> None:
    """Records that could not be read are missing from the CSV, which no row can say: the command fails, its
    predictions kept.

    Raises:
        DataError: one line naming the first file, the record from which it could not be read and why.
    """
    if unread:
        more = f"; {len(unread) - 1} more file(s) stopped the same way" if len(unread) > 1 else ""
        raise DataError(f"predict.input: {unread[0]}{more}; {output} holds {rows} rows, none for the records after it")
