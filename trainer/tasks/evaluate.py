"""`mode=evaluate`: a trained checkpoint on the test or validation split, with its confusion matrix.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00 [evaluate.split=val] [evaluate.tta=flip]
    python run.py mode=evaluate checkpoint=RUN evaluate.watch=true    # beside training: trainer.tasks.watch

Evaluation uses the evaluation pipeline (no augmentation) and dropout off.
"""

from __future__ import annotations

import logging

from trainer.config.schema import Config
from trainer.distribute import topology
from trainer.distribute.failures import collective_errors, errors_told_to_peers
from trainer.runs import checkpoints
from trainer.runs.atomic import write_json
from trainer.tasks.data import load_data
from trainer.tasks.runtime import check_replica_batches, run_folder, setup_strategy
from trainer.tasks.scoring import Evaluation, evaluate_checkpoint

log = logging.getLogger(__name__)


def evaluate(settings: Config) -> float:
    """Evaluates `checkpoint` on `evaluate.split`; writes metrics.json and the confusion matrix.

    Returns:
        The accuracy, as a plain float.
    """
    if settings.evaluate.watch:
        from trainer.tasks.watch import watch

        return watch(settings)
    checkpoints.info_of(settings.checkpoint)  # a bad checkpoint= is one line before any data is read
    strategy = setup_strategy(settings)
    split = settings.evaluate.split
    how = Evaluation.of(settings, report=topology.is_chief(strategy))
    # The split, the test split's first batch (the model's step state) and, for the report, val (its temperature).
    reads = (split, "test", *(["val"] if how.report else []))
    with errors_told_to_peers(strategy):  # a worker's own error stops its peers at once, with its line
        data = load_data(
            settings.dataset, settings.trainer.batch_size, settings.seed, check_val=split == "val", reads=reads
        )
        examples = {split: data.num_examples[split]}
        check_replica_batches(settings.trainer.batch_size, strategy.num_replicas_in_sync, examples)
        with run_folder(settings.output_dir, topology.is_chief(strategy)) as run_dir:
            with collective_errors(strategy), data.named_bad_records():
                results = evaluate_checkpoint(strategy, settings.checkpoint, data, split, run_dir, how)
            results["split"] = split
            write_json(run_dir / "metrics.json", results)
    log.info("%s accuracy %.4f, loss %.4f", split, results["accuracy"], results["loss"])
    written = [
        name for name in sorted(path.name for path in run_dir.iterdir()) if name.endswith((".json", ".csv", ".png"))
    ] + (["report/"] if (run_dir / "report").is_dir() else [])
    log.info("Wrote %s to %s", ", ".join(written), run_dir.resolve())
    return results["accuracy"]
