"""The training task, in steps: plan the run, build the model, open the run folder, fit the phases, finish.

    python run.py                      # VGG19 on the bundled digits
    python run.py dataset=cifar dataset.data_dir=/data/cifar10 strategy=mirrored

The run folder gets checkpoints/{best,last}.keras, history.csv, tensorboard/
and metrics.json. `train` returns the objective (best `objective.metric`).
In a multi-worker run only the chief writes there; the other workers write
the same files to a temporary folder (saving needs every worker) and delete it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import random
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from hydra.utils import get_method

from trainer.config.schema import Config, LoggerConfig, TensorBoardConfig
from trainer.data.decode import DECODE
from trainer.data.module import DataModule
from trainer.distribute import topology
from trainer.distribute.failures import collective_errors, errors_told_to_peers
from trainer.errors import ConfigError, Interrupted
from trainer.models.preprocessing import Models, build_models
from trainer.models.registry import build_model
from trainer.runs import checkpoints, history, storage
from trainer.runs.atomic import write_json
from trainer.runs.backup import remove_backup
from trainer.runs.checkpoints import ModelInfo, weights_fingerprint
from trainer.runs.resume import resolve_resume
from trainer.runs.storage import OutputFolders
from trainer.search.trial import StudyTrial, record_interrupted, record_outcome
from trainer.serving import latency
from trainer.tasks import init_from as starting
from trainer.tasks import parts
from trainer.tasks import phases as fitting
from trainer.tasks.data import load_data
from trainer.tasks.export import export_to_model_dir
from trainer.tasks.holding import open_run_folder, sweep_job_folder
from trainer.tasks.plan import Folder, LateChecks, Plan, check_updates, log_training_options, phases
from trainer.tasks.resources import check_memory
from trainer.tasks.runtime import check_replica_batches, run_folder, setup_strategy
from trainer.tasks.scoring import Evaluation, check_report_split, evaluate_checkpoint
from trainer.tasks.watch import is_evaluator, watch
from trainer.tracking.curves import wait_for_drawings
from trainer.tracking.reports import run_summary
from trainer.tracking.tensorboard import write_test_metrics
from trainer.training import precision
from trainer.training.callbacks import STOPPED_BY, TIME_BUDGET
from trainer.training.optimizers import peak_learning_rate

log = logging.getLogger(__name__)

METRICS = ("loss", "accuracy")


def _objective_metric(settings: Config) -> str:
    metric = settings.objective.metric
    names = [*METRICS, *(f"val_{name}" for name in METRICS)]
    if metric not in names:
        raise ConfigError(f"objective.metric must be one of {names}; got {metric!r}")
    if not settings.trainer.validate and metric.startswith("val_"):
        raise ConfigError(
            f"trainer.validate=false leaves no {metric} for objective.metric: choose objective.metric="
            f"{metric.removeprefix('val_')} (best.keras then follows it), and validate with an evaluator beside "
            f"training (mode=evaluate checkpoint=RUN evaluate.watch=true)"
        )
    return metric


def _prune_metric(settings: Config, metric: str) -> str:
    """The metric a search's pruner is told each epoch: `objective.prune_metric` (its name and direction checked
    by `ObjectiveConfig`), else the objective's."""
    pruned_on = settings.objective.prune_metric or metric
    if not settings.trainer.validate and pruned_on.startswith("val_"):
        raise ConfigError(f"trainer.validate=false leaves no {pruned_on} for objective.prune_metric: choose "
                          f"objective.prune_metric={pruned_on.removeprefix('val_')}")  # fmt: skip
    return pruned_on


# --- 1. plan the run ------------------------------------------------------------------------------------------


def plan_run(settings: Config, strategy: tf.distribute.Strategy) -> Plan:
    """The run folder and its trackers, the data, the steps per epoch and the peak rate on `strategy`
    (`setup_strategy`'s), each checked and logged; what only the end needs is checked after the first step
    (`Plan.late_checks`: every record's label, the report's two classes in the test split; a multi-worker run
    checks them here).

    Raises:
        ConfigError: an unknown objective, a tracking server that cannot be reached (before any data is
            read), or a batch larger than the training split.
    """
    metric = _objective_metric(settings)
    pruned_on = _prune_metric(settings, metric)
    chief = topology.is_chief(strategy)
    output_dir = resolve_resume(settings.resume, settings.output_dir)
    # Only the chief logs: the other workers' files go to a temporary folder that is deleted.
    outputs = output_folders(output_dir) if chief else OutputFolders()
    logger = settings.logger
    if outputs.tensorboard and logger.tensorboard is None:  # Vertex AI's job asked for a TensorBoard
        logger = dataclasses.replace(logger, tensorboard=TensorBoardConfig())
    board = tensorboard_dir(logger, output_dir, outputs)
    trackers, tensorboard = parts.build_trackers(logger, board) if chief else ([], [])
    keras.utils.set_random_seed(settings.seed)
    batch, replicas = settings.trainer.batch_size, strategy.num_replicas_in_sync
    several = topology.in_multi_worker_mode(strategy)
    data = load_data(
        settings.dataset,
        batch,
        settings.seed,
        model_preprocessing=settings.model.preprocessing,
        num_workers=topology.num_input_pipelines(strategy),
        replicas=replicas,
        check_records=several,  # one process: in `late`, after the first step
    )
    if batch > data.num_examples["train"]:  # with trainer.steps_per_epoch too: each batch would repeat records
        raise ConfigError(
            f"trainer.batch_size={batch} is larger than the {data.num_examples['train']} training records"
        )
    size, stored = data.input_shape[0], data.resize_to
    log.info(
        "Model input %dx%d%s <dataset.image_size=%s>",
        size,
        size,
        f": images resized to {stored}, then cropped to {size} (dataset.augment.crop_size)" if stored != size else "",
        settings.dataset.image_size,
    )
    check_replica_batches(batch, replicas, {split: data.num_examples[split] for split in ("val", "test")})
    # After the first step, in its shadow: every record's label (binary data), 2 classes in the test split for
    # the report at the end. A bad training record met before is named by the pipeline.
    report_split = functools.partial(check_report_split, data, "test", Evaluation.of(settings, report=chief))
    late = LateChecks([data.check_records, report_split])
    if several:  # a worker's own bad data: one line before any collective, its peers told to restart as they were
        late.run()
    steps = settings.trainer.steps_per_epoch or data.train_steps
    count, left_out = data.num_examples["train"], data.train_left_out
    last = count - left_out - (data.train_steps - 1) * batch  # the last batch of an epoch: partial, or whole
    log.info(
        "Global batch %d = %d replica(s) x %d, %d steps per epoch%s <trainer.batch_size=%d%s>",
        batch,
        replicas,
        batch // replicas,
        steps,
        f" (the last of {last} images)" if last < batch and not settings.trainer.steps_per_epoch else "",
        batch,
        f" trainer.steps_per_epoch={steps}" if settings.trainer.steps_per_epoch else "",
    )
    if left_out and not settings.trainer.steps_per_epoch:
        log.info(
            "Each epoch leaves out %d of the %d training images (a new draw each epoch): %s <trainer.batch_size=%d%s>",
            left_out,
            count,
            "every worker runs the same whole steps" if several else f"a batch is split among {replicas} replicas",
            batch,
            " strategy=multi_worker" if several else "",
        )
    check_updates(settings, steps)
    log_training_options(settings, steps)
    opt = settings.optimizer
    lr = peak_learning_rate(opt.lr, batch, opt.lr_batch_size, replicas, opt.scale_with_replicas)
    if opt.lr_batch_size and lr != opt.lr:
        log.info(
            "Peak lr %g = %g x batch %d / %d (linear scaling) <optimizer.lr_batch_size=%d>",
            lr,
            opt.lr,
            batch,
            opt.lr_batch_size,
            opt.lr_batch_size,
        )
    return Plan(
        strategy, chief, output_dir, trackers, tensorboard, data, steps, lr, phases(settings), metric, board, outputs,
        late_checks=late, prune_metric=pruned_on,
    )  # fmt: skip


def output_folders(output_dir: str) -> OutputFolders:
    """Vertex AI's output folders (`AIP_*`), each made and checked writable through tf.io.gfile, and logged; a
    sweep's job (`output_dir` in the sweep folder) writes into their sub-folder of the job's own (`3/`).

    Raises:
        DiskError: a folder cannot be written, naming its variable.
        DataError: AIP_MODEL_DIR holds a SavedModel already.
    """
    outputs, sweep = OutputFolders.from_environment(), sweep_job_folder()
    if sweep is not None and outputs.given():  # the jobs share the variables, not the folders
        outputs = outputs.within(*Path(output_dir).relative_to(sweep).parts)
    what = {
        "AIP_TENSORBOARD_LOG_DIR": "TensorBoard's event files",
        "AIP_CHECKPOINT_DIR": "a copy of checkpoints/ and backup/ at every epoch end",
        "AIP_MODEL_DIR": "the SavedModel, at the end of training",
    }
    for name, folder in outputs.given().items():
        storage.check_writable(folder, name)
        if name == "AIP_MODEL_DIR":  # the docs promise this at start-up, not after the training
            storage.check_no_saved_model(folder, name)
        log.info("%s go to %s <%s>", what[name], folder, name)
    return outputs


def tensorboard_dir(logger: LoggerConfig, output_dir: str, outputs: OutputFolders) -> str:
    """Where TensorBoard writes: `logger.tensorboard.log_dir`, else Vertex AI's folder, else RUN/tensorboard."""
    given = logger.tensorboard.log_dir if logger.tensorboard is not None else None
    return given or outputs.tensorboard or str(Path(output_dir) / "tensorboard")


# --- 2. build the model ---------------------------------------------------------------------------------------


def _takes(target: str, argument: str) -> bool:
    """Whether the builder `target` has a parameter `argument` (False when it cannot be imported: building it
    then fails with its own clear error)."""
    try:
        return argument in inspect.signature(get_method(target)).parameters
    except Exception:  # noqa: BLE001  # not importable, not a function: build_model names it
        return False


def build_network(settings: Config, data: DataModule, replicas: int) -> keras.Model:
    """The configured network (float input of `data.input_shape`), uncompiled; call inside `strategy.scope()`.

    On more than one replica, a builder that takes `synchronized_batch_norm` (VGG19's, or your own) gets True:
    batch norm's statistics over the global batch."""
    model = settings.model
    options = model.builder_options()
    if _takes(model._target_, "synchronized_batch_norm"):
        options["synchronized_batch_norm"] = replicas > 1
    return build_model(model._target_, options, len(data.class_names), data.input_shape)


def _build_in_precision(settings: Config, plan: Plan) -> tuple[str, Models]:
    """(the policy, the models built in it) for `trainer.precision`: auto resolves it for the hardware, then for
    the model; a resumed run goes on in the policy its last.keras names.

    Auto counts the network built in float32 and builds it again in half precision only where the count says
    so: a network built in a mixed policy and set back to float32 computes the same but steps ~9% slower than
    one built in float32 (the demo's, measured side by side). The second build draws the first's weights."""
    data, wanted = plan.data, str(settings.trainer.precision)
    resumed = _trained_precision(plan.output_dir) if settings.resume and wanted == "auto" else None
    hardware = precision.detect_hardware()
    policy, reason = precision.choose(resumed or wanted, hardware)
    counted = wanted == "auto" and not resumed and policy != "float32"
    keras.mixed_precision.set_global_policy("float32" if counted else policy)  # before any layer is built
    draws = random.getstate(), np.random.get_state()  # the initializers' seeds come from Python's random
    replicas = plan.strategy.num_replicas_in_sync
    with collective_errors(plan.strategy), plan.strategy.scope():  # variables are broadcast from the chief
        network = build_network(settings, data, replicas)
        if counted:
            policy, reason = precision.choose(wanted, hardware, precision.gflops_per_image(network))
            if policy != "float32":
                keras.mixed_precision.set_global_policy(policy)
                random.setstate(draws[0])
                np.random.set_state(draws[1])
                network = build_network(settings, data, replicas)
        models = build_models(network, data.normalization, data.augment, settings.seed, data.augment.mixing)
    reason = "the run trained in it: its last.keras says so" if resumed else reason
    emulated = reason.startswith("emulated")
    (log.warning if emulated else log.info)("Precision %s (%s) <trainer.precision=%s>", policy, reason, wanted)
    return policy, models


def build_run_model(settings: Config, plan: Plan) -> tuple[Models, ModelInfo]:
    """uint8 in; the inference model owns its cast and normalization, the training model adds the flip and colour
    jitter. Returns both with the `ModelInfo` their checkpoints carry."""
    data = plan.data
    policy, models = _build_in_precision(settings, plan)
    info = ModelInfo(
        tuple(data.class_names),
        data.input_shape[0],
        data.resize_to,
        data.normalization,
        settings.dataset.name,
        resize_mode=data.resize_mode,
        decode=DECODE,
        precision=policy,
    )
    log.info(
        "Model %s: %s parameters, input %s, lr %g <model=%s optimizer=%s>",
        models.inference.name,
        f"{models.inference.count_params():,}",
        data.input_shape,
        plan.lr,
        settings.model.name,
        settings.optimizer.name,
    )
    return models, info


def _trained_precision(run_dir: str) -> str | None:
    """The policy a resumed run trained in (its last.keras says), so that it goes on in it on any hardware."""
    last = Path(run_dir) / "checkpoints" / "last.keras"
    info = checkpoints.read_info(last) if last.is_file() else None
    return info.precision if info is not None and info.precision else None


# --- 3. open the run folder: trainer.tasks.holding ------------------------------------------------------


# --- 4. fit the phases: trainer.tasks.phases ---------------------------------------------------------------


# --- 5. finish ------------------------------------------------------------------------------------------------


def finish(
    settings: Config, plan: Plan, folder: Folder, model: keras.Model, outcome: str, seconds: float, start: dict
) -> dict:
    """The best epoch from history.csv, the best checkpoint on the test split, metrics.json (with `start`: what
    `model.init_from` started the run from); then the backup goes, the trackers get the files and the summary
    is logged. Returns metrics.json's content."""
    run_dir = folder.run_dir
    plan.late_checks.run()  # done after the first step; a resumed run with every epoch done trained none
    values = history.columns(history.read_rows(run_dir / history.FILE))
    best = history.best_index(values[plan.metric], settings.objective.mode, settings.objective.tolerance)
    log.info("Training done (%s): evaluating the best checkpoint on the test split", outcome.replace("_", " "))
    best_keras, tta = run_dir / "checkpoints" / "best.keras", settings.evaluate.tta
    how = Evaluation.of(settings, report=plan.chief)
    test = evaluate_checkpoint(plan.strategy, best_keras, plan.data, "test", run_dir, how)
    batch, epochs = settings.trainer.batch_size, len(values[plan.metric])
    metrics = {
        "name": folder.run_name,
        "tags": folder.tags,
        "objective": float(values[plan.metric][best]),
        "objective_metric": plan.metric,
        "best_epoch": best + 1,
        "epochs_completed": epochs,
        "stopped_early": outcome == "stopped_early",
        "pruned": outcome == "pruned",  # a search's pruner stopped this trial
        # trainer.validate=false: none (an evaluator beside training has them)
        **{name: float(values[name][best]) for name in ("val_accuracy", "val_loss") if name in values},
        **{f"test_{name}": value for name, value in test.items() if name not in ("checkpoint", "tta")},
        **({"test_tta": tta} if tta != "none" else {}),
        "train_seconds": round(seconds, 2),
        "train_images_per_second": round((epochs - folder.done) * plan.steps_per_epoch * batch / seconds, 1),
        "num_examples": plan.data.num_examples,
        "skipped_files": len(plan.data.skipped),  # files of the data that give no image (dataset=folder)
        **({"skipped": plan.data.skipped} if plan.data.skipped else {}),
        "num_replicas": plan.strategy.num_replicas_in_sync,
        "weights_sha256": weights_fingerprint(model),
        **({"init_from": start} if start else {}),  # model.init_from: the weights the run started from
        **(_latency(best_keras) if latency.METRIC in (settings.objective.metrics or []) and plan.chief else {}),
    }
    write_json(run_dir / "metrics.json", metrics)
    remove_backup(folder.backup_dir)  # only now: a kill before this resumes into the evaluation
    if plan.outputs.checkpoints:
        storage.remove_folder(storage.join(plan.outputs.checkpoints, "backup"))
    log.info(  # on every worker: the figures and weights must agree across workers
        "Test accuracy %.4f, test loss %.4f. Final weights sha256 %s",
        metrics["test_accuracy"],
        metrics["test_loss"],
        metrics["weights_sha256"],
    )
    sheets = [run_dir / name for name in parts.ARTIFACTS if name.startswith("report/") and name.endswith(".png")]
    if plan.tensorboard:
        write_test_metrics(plan.tensorboard_dir, metrics, metrics["best_epoch"], sheets)
    wait_for_drawings()  # curves.png, drawn in the background while the test evaluation ran
    tracked = {**metrics, **parts.class_figures(metrics.get("test_per_class", {}))}
    for tracker in plan.trackers:
        tracker.finish(tracked, [run_dir / artifact for artifact in parts.ARTIFACTS], run_dir)
    if plan.chief:
        log.info("%s", run_summary(run_dir, metrics, plan.tensorboard_dir if plan.tensorboard else None))
    return metrics


def _latency(checkpoint: Path) -> dict:
    """{latency_ms, latency (how it was measured)} of the best checkpoint, for a search over speed.

    Raises:
        ConfigError: the model cannot be exported as a SavedModel (the latency is measured on its `serve`).
    """
    try:
        milliseconds = latency.serve_latency_ms(checkpoint)
    except Exception as error:  # noqa: BLE001 - Keras's and TensorFlow's many export errors: one line naming the key
        reason = " ".join(str(error).split())[:300]
        raise ConfigError(f"objective.metrics: latency_ms is measured on the exported SavedModel, and {checkpoint} "
                          f"cannot be exported: {reason}") from None  # fmt: skip
    log.info("Latency %.3f ms (%s) <objective.metrics>", milliseconds, latency.SOURCE)
    return {latency.METRIC: round(milliseconds, 3), "latency": latency.SOURCE}


def train(settings: Config, config_tree: str | None = None) -> float | None:
    """Trains, evaluates the best checkpoint on the test split and writes metrics.json.

    Args:
        settings: The typed config.
        config_tree: A resume's printed config, saved as RUN/config_tree.txt once the resume is accepted.

    Returns:
        The best value of `objective.metric` over the epochs, as a plain float (None if preempted).

    Raises:
        Interrupted: Ctrl-C stopped training, or SIGTERM stopped a sweep's job (the sweep stops too); the backup
            is saved and the message says how to continue.
    """
    if is_evaluator(settings):  # TF_CONFIG's evaluator task: it watches the run instead of training
        with run_folder(settings.output_dir, chief=False):  # removes Hydra's temporary folder of this task
            return watch(settings, evaluator=True)
    init_from, resumed = settings.model.init_from, bool(settings.resume)
    start = {}  # what metrics.json records of model.init_from; a resumed run goes on from its own backup
    if init_from:
        start = {"file": init_from} if resumed else {"file": str(starting.source_file(init_from))}  # before the data
    strategy = setup_strategy(settings)
    with errors_told_to_peers(strategy):  # a worker's own error stops its peers at once, with its line
        plan = plan_run(settings, strategy)
        models, info = build_run_model(settings, plan)
        check_memory(settings, plan, models, info.precision)  # before anything trains: the one line that fits
        if init_from and not resumed:
            start = starting.start_from(init_from, models, plan.data.class_names, plan.strategy)
        with open_run_folder(settings, plan, config_tree) as folder:
            started = time.perf_counter()
            outcome = fitting.fit_phases(settings, plan, folder, models, info)
            if outcome not in ("preempted", "interrupted"):
                seconds = time.perf_counter() - started
                metrics = finish(settings, plan, folder, models.inference, outcome, seconds, start)
    if outcome not in ("preempted", "interrupted") and plan.chief:
        fold = settings.dataset.fold if settings.dataset.folds else None
        record_outcome(StudyTrial(**vars(settings.trial)), metrics, fold)  # the sweep reads it from the study
        if plan.outputs.model:  # Vertex AI's model folder: the deployable SavedModel, checked like mode=export's
            export_to_model_dir(settings, str(folder.run_dir), plan.outputs.model)
    in_sweep = fitting.sweep_job() is not None
    stopped = folder.invocation.get("stopped")
    if outcome == "interrupted" or (outcome == "preempted" and in_sweep and stopped != STOPPED_BY[TIME_BUDGET]):
        # The folder is released (the lock, the invocation's end line). In a sweep SIGTERM stops the sweep as
        # Ctrl-C does, and the trial is run again by the sweep command.
        if in_sweep and plan.chief:
            fold = settings.dataset.fold if settings.dataset.folds else None
            record_interrupted(StudyTrial(**vars(settings.trial)), fold)

        hint = fitting.how_to_continue(settings, folder.run_dir) if in_sweep else None
        said = "interrupted (Ctrl-C)" if outcome == "interrupted" else f"stopped by {stopped}"
        hint = hint or f"run: python run.py resume={folder.run_dir}"
        raise Interrupted(f"{said}; the backup is saved. To continue, {hint}")
    return None if outcome == "preempted" else metrics["objective"]
