"""A checkpoint scored on one split: its metrics, confusion matrix and report. Training's test evaluation
(`trainer.tasks.train`), `mode=evaluate` (`trainer.tasks.evaluate`) and the watcher (`trainer.tasks.watch`) call it.

    python run.py mode=evaluate checkpoint=RUN evaluate.split=val evaluate.tta=flip

Evaluation uses the evaluation pipeline (no augmentation) and dropout off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer.config.schema import Config
from trainer.data.module import DataModule
from trainer.distribute.watchdog import step_watchdog
from trainer.evaluation.report import ReportOptions, check_classes, write_report
from trainer.models.tta import with_tta
from trainer.runs import checkpoints
from trainer.tracking.reports import plot_confusion_png, write_confusion_csv
from trainer.training import metrics
from trainer.training.tracing import build_step_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """How `evaluate_checkpoint` evaluates: the test-time augmentation, the k of top-k accuracy, the report."""

    tta: str = "none"  # none | flip
    top_k: int = 5  # top-k accuracy with k = min(top_k, classes - 1) above 2 classes; 0: none
    report: ReportOptions | None = None  # None: no report

    @classmethod
    def of(cls, settings: Config, report: bool) -> Evaluation:
        """The `evaluate` section's choices; the report only where `report` (the chief's evaluation) and asked."""
        chosen = settings.evaluate
        options = ReportOptions(chosen.report_images, chosen.cam_layer) if report and chosen.report else None
        return cls(chosen.tta, chosen.top_k, options)


def check_report_split(data: DataModule, split: str, how: Evaluation) -> None:
    """That the report `how` asks for at training's end has two classes in `split` to draw. Training runs it
    right after its first step, before anything of the run is saved (`trainer.tasks.plan.LateChecks`; a
    multi-worker run before its first step). The part's class counts where it knows them, else the split's
    labels (no image decoded where it can).

    Raises:
        DataError: the split holds one class.
    """
    if how.report is None:
        return
    counts = (data.class_counts or {}).get(split)
    if counts is not None:
        labels = np.array([data.class_names.index(name) for name, count in counts.items() if count], np.int64)
    elif data.labels_of is not None:
        labels = data.labels_of(split)
    else:
        return  # the report checks what it predicted
    check_classes(labels, data.class_names, split)


def evaluate_checkpoint(
    strategy: tf.distribute.Strategy,
    checkpoint: str | Path,
    data: DataModule,
    split: str,
    run_dir: Path,
    how: Evaluation = Evaluation(),
) -> dict:
    """Loads a checkpoint, checks that `data` fits it, evaluates it on `split` in one pass (with test-time
    augmentation `how.tta`: none or flip) and writes the confusion matrix as CSV and PNG; with `how.report`,
    also the evaluation report (`trainer.evaluation.report`), its temperature fitted on the validation split.

    Returns:
        The metrics of `trainer.training.metrics.evaluate`, plus the checkpoint's path, the `tta` and with a
        report its calibration figures.

    Raises:
        DataError: the data's class names or image size differ from the model's.
    """
    class_names = data.class_names
    with strategy.scope():
        model, info = checkpoints.load(checkpoint)
        checkpoints.check_data(checkpoints.resolve(checkpoint), info, class_names, data.input_shape[0], "the dataset")
        tta = how.tta
        plain, model = model, with_tta(model, tta)
        metrics.compile_for_evaluation(model, len(class_names), how.top_k)
    # never a cached split: its cache would be cut short
    build_step_state(model, next(iter(data.split("test").take(1))))
    results, matrix = metrics.evaluate(model, data.split(split), class_names, step_watchdog(strategy))
    write_confusion_csv(run_dir / f"confusion_matrix_{split}.csv", matrix, class_names)
    plot_confusion_png(
        run_dir / f"confusion_matrix_{split}.png",
        matrix,
        class_names,
        f"{split} split: accuracy {results['accuracy']:.4f}",
    )
    if how.report is not None:
        held_out = split != "val" and data.num_examples.get("val") and not data.val_is_test  # never fit on test
        calibrate_on = data.split("val") if held_out else None
        dataset = data.split(split)
        results.update(write_report(run_dir, model, plain, dataset, class_names, split, how.report, calibrate_on))
    results["checkpoint"] = str(checkpoints.resolve(checkpoint))
    results["tta"] = tta
    log.info(
        "Evaluated %s on %s%s: accuracy %.4f, loss %.4f over %d examples",
        results["checkpoint"],
        split,
        " with flip TTA (the mean of each image and its mirror) <evaluate.tta=flip>" if tta == "flip" else "",
        results["accuracy"],
        results["loss"],
        results["num_examples"],
    )
    return results
