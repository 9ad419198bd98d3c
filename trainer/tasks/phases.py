"""Fitting a run's phases: one for a model trained from scratch; for a pretrained base, the head, then the base.

    python run.py experiment=cats_dogs_finetune      # 2 epochs of the new head, then block5 too at a tenth of the lr

Each phase freezes what it freezes, compiles its own optimizer and schedule, builds its step
functions' state so each is traced once, and calls Keras `fit` with the run's callbacks. The
step "fit the phases" of `trainer.tasks.train`.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import keras
import tensorflow as tf

from trainer.config.schema import Config
from trainer.data.module import DataModule
from trainer.distribute import strategies, topology
from trainer.distribute.agreement import Workers
from trainer.distribute.watchdog import step_watchdog
from trainer.fields import duration_seconds
from trainer.models.finetune import set_trainable
from trainer.models.preprocessing import Models
from trainer.runs.backup import RunBackup, mark_ended
from trainer.runs.backup import restore as restore_backup
from trainer.runs.checkpoints import ModelInfo
from trainer.runs.resume import CHIEF_RUN
from trainer.runs.storage import Mirror
from trainer.search.trial import StudyTrial, pruned, pruning_callbacks
from trainer.tasks import parts, weights
from trainer.tasks.plan import Folder, Phase, Plan, fine_tunes
from trainer.tracking.tensorboard import RunLabel, SampleImages
from trainer.training.callbacks import (
    STOPPED_BY,
    TIME_BUDGET,
    AfterFirstStep,
    Preempted,
    RunFiles,
    TimeBudget,
    training_callbacks,
)
from trainer.training.compiling import build_phase_optimizer, compile_model
from trainer.training.cost import RunTime
from trainer.training.optimizers import build_learning_rate
from trainer.training.resumed import WithinEpoch, going_on
from trainer.training.tracing import build_step_state

log = logging.getLogger(__name__)


# --- 4. fit the phases ----------------------------------------------------------------------------------------


def compile_phase(model: keras.Model, settings: Config, lr: float, steps_per_epoch: int, epochs: int) -> None:
    """Compiles `model` for a phase of `epochs` at peak rate `lr` with the run's optimizer, schedule, loss and
    `trainer.*` compile options; call inside the strategy's scope."""
    schedule, trainer = settings.optimizer.schedule, settings.trainer
    learning_rate = build_learning_rate(
        schedule.target,
        lr,
        steps_per_epoch,
        epochs,
        warmup_epochs=schedule.warmup_epochs,
        alpha=schedule.alpha,
        boundaries=list(schedule.boundaries),
        factor=schedule.factor,
    )
    optimizer = build_phase_optimizer(
        settings.optimizer._target_, settings.optimizer.keras_options(), learning_rate, trainer.grad_accum_steps
    )
    compile_model(
        model,
        optimizer,
        label_smoothing=trainer.label_smoothing,
        soft_labels=settings.dataset.augment.mixing,  # MixUp's and CutMix's labels
        jit_compile=trainer.jit_compile,
        steps_per_execution=trainer.steps_per_execution,
    )


def _log_xla(model: keras.Model, jit_compile: str) -> None:
    log.info("XLA %s <trainer.jit_compile=%s>", "on" if model.jit_compile is True else "off", jit_compile)
    if model.jit_compile is True and not tf.config.list_physical_devices("GPU"):
        log.warning(
            "XLA without a GPU: on the CPU it makes VGG19 training 3-7x slower; "
            "use trainer.jit_compile=auto <trainer.jit_compile=%s>",
            jit_compile,
        )


def _loggers(plan: Plan, folder: Folder) -> list[keras.callbacks.Callback]:
    """TensorBoard (`logger=tensorboard`), with the run's name and tags and the first training images, read in
    order (no shuffle buffer to fill) once the first step is done."""
    if not plan.tensorboard:
        return []
    log_dir = plan.tensorboard_dir

    def samples():
        return next(iter(plan.data.split("train").take(1)))[0][:8].numpy()

    return [*plan.tensorboard, RunLabel(log_dir, folder.run_name, folder.tags), SampleImages(log_dir, samples)]


def _state_batch(data: DataModule) -> tuple[tf.Tensor, tf.Tensor]:
    """What each phase's step state is built from (`build_step_state`): one black image of the model's input
    and label 0, of the pipelines' types (uint8, int32). Only shapes and types count, so no pipeline is built
    or read for it before the first step."""
    return tf.zeros([1, *data.input_shape], tf.uint8), tf.zeros([1], tf.int32)


def _run_files(
    settings: Config, plan: Plan, folder: Folder, models: Models, info: ModelInfo, budget: TimeBudget | None
) -> RunFiles:
    """What the run's own callbacks write; curves.png is titled with the run's name, dataset and model."""
    name = "/".join(Path(plan.output_dir).parts[-2:])
    title = f"{name}  ·  dataset={settings.dataset.name}  ·  model={settings.model.name}"
    mode, every = settings.objective.mode, settings.trainer.save_every_steps
    ema = settings.optimizer.ema_momentum is not None
    workers = Workers(plan.strategy) if topology.in_multi_worker_mode(plan.strategy) else None  # no per-step cost
    tolerance = settings.objective.tolerance
    return RunFiles(
        folder.run_dir,
        folder.backup_dir,
        models.inference,
        info,
        plan.metric,
        mode,
        every,
        tolerance,
        title,
        ema,
        workers,
        budget,
        plan.outputs.checkpoints,
    )


def time_budget(settings: Config, plan: Plan) -> TimeBudget | None:
    """trainer.time_budget, counted from the start of the run, for every phase."""
    seconds = duration_seconds(settings.trainer.time_budget, "trainer.time_budget")
    return TimeBudget(seconds, plan.started, plan.steps_per_epoch) if seconds else None


def fit_phases(settings: Config, plan: Plan, folder: Folder, models: Models, info: ModelInfo) -> str:
    """Trains every phase not done yet, each with its own compile and schedule: `models.training` is fitted and
    backed up, `models.inference` (the same layers) is what the checkpoints hold.

    Returns:
        `completed`, `stopped_early` (an early stop ended training; no later phase starts), `pruned` (the
        same, by a search's pruner), `preempted`
        (SIGTERM stopped training: the backup is saved and the way to resume logged) or `interrupted` (the same
        after Ctrl-C).
    """
    strategy, steps, last = plan.strategy, plan.steps_per_epoch, plan.phases[-1]
    model = models.training
    if folder.done == settings.trainer.epochs or folder.ended:  # killed in the test evaluation: the final
        # weights are in the backup
        if folder.ended:
            log.info("Training ended after epoch %d (%s): running the test evaluation the interrupted run missed",
                     folder.done, folder.ended.replace("_", " "))  # fmt: skip
        else:
            log.info("All %d epochs are done: running the test evaluation the interrupted run missed", folder.done)
        with strategy.scope():
            compile_phase(model, settings, plan.lr * last.lr_scale, steps, last.end - last.start)
            restore_backup(model, folder.backup_dir, models.inference)  # builds the optimizer: inside the scope
            Workers(strategy).take_chief_state(model)
            model.optimizer.finalize_variable_values(model.trainable_variables)  # the EMA, as after fit
        return folder.ended or "completed"
    extra = parts.build_callbacks(settings.callbacks, settings.optimizer.schedule, settings.trainer.validate)
    extra += pruning_callbacks(StudyTrial(**vars(settings.trial)), plan.prune_metric, plan.chief)  # a search's pruner

    state_batch = _state_batch(plan.data)
    loggers_ = _loggers(plan, folder)
    class_weights = weights.class_weight(settings, plan.data)
    progress = plan.chief and settings.trainer.verbose == 1 and sys.stderr.isatty()
    switched_here = False  # a phase ended in this process and the next one starts here
    budget = time_budget(settings, plan)
    for phase in plan.phases:
        if folder.done >= phase.end:
            continue
        _start_phase(settings, plan, model, phase, state_batch)
        files = _run_files(settings, plan, folder, models, info, budget)
        # After EpochLog's first-step line, before RunBackup: the checks the first step did not wait for
        later = [AfterFirstStep(plan.late_checks.run), *extra, *plan.trackers]
        callbacks = training_callbacks(files, loggers_, later, progress)
        callbacks += step_watchdog(strategy)  # multi-worker: a step waiting on a hung peer stops the cluster
        callbacks.append(RunTime(steps, settings.trainer.epochs, max(folder.done, phase.start)))  # the time it takes
        if folder.gate is not None:  # first: it checks the data before anything of the epoch is saved
            callbacks.insert(0, folder.gate)
        if switched_here:
            # The backup holds the previous phase's optimizer; restoring it into this one would skip its
            # variables with a Keras warning. Back up the model as it stands, with this phase's optimizer.
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
            backup = next(callback for callback in callbacks if isinstance(callback, RunBackup))
            backup.set_model(model)
            backup.save(phase.start)
        first = max(folder.done, phase.start)
        passed = min(folder.steps, steps) if first == folder.done else 0  # a backup made within epoch `first`
        # Each phase's fit reads the input stream from its start; a resumed one goes on where its backup was made.
        train, train_for_worker, class_weight = weights.weighted_training_data(
            settings, plan.data, class_weights, (first - phase.start) * steps + passed
        )
        if passed:
            where = going_on(first, passed, steps)
            log.info(
                "%s, where its backup was made: %s",
                where[0].upper() + where[1:],
                f"the {passed} step(s) before it are not trained again" if passed < steps
                else "no step is trained again; its validation and checkpoints are made now",
            )  # fmt: skip
            # verbose=0: EpochLog prints the one line per epoch (and ProgressBar the bar)
            listed = WithinEpoch(callbacks, model, first, passed, verbose=0, epochs=phase.end, steps=steps)
        try:
            model.fit(
                strategies.distribute_training_data(strategy, train, train_for_worker),
                initial_epoch=first,
                epochs=phase.end,
                steps_per_epoch=steps,
                validation_data=plan.data.split("val") if settings.trainer.validate else None,  # an evaluator may do it
                verbose=0,  # EpochLog prints the one line per epoch (and ProgressBar the bar)
                callbacks=listed if passed else callbacks,
                shuffle=False,  # the pipeline shuffles, seeded
                class_weight=class_weight,
            )
        except Preempted as stop:
            by = STOPPED_BY[stop.signum]
            if stop.signum == TIME_BUDGET:
                by = f"the time budget (trainer.time_budget={settings.trainer.time_budget})"
            several = topology.in_multi_worker_mode(strategy)
            resume = folder.run_dir if plan.chief else CHIEF_RUN
            if stop.signum != TIME_BUDGET and sweep_job() is not None:  # the sweep stops too (tasks.train)
                log.warning("Stopped by %s in epoch %d; the backup is in %s. To continue, %s", by, stop.epoch + 1,
                            folder.backup_dir, how_to_continue(settings, folder.run_dir))  # fmt: skip
            else:
                log.warning(
                    "Stopped by %s %s; the backup is in %s: resumed, %s. To continue, run%s: python run.py resume=%s",
                    by,
                    f"in epoch {stop.epoch + 1}, after step {stop.steps} of {steps}" if stop.steps
                    else f"after epoch {stop.epoch}",
                    folder.backup_dir if plan.chief else "the chief's run folder",
                    going_on(stop.epoch, stop.steps, steps, settings.trainer.epochs),
                    " on every worker" if several else "",
                    resume,
                )  # fmt: skip
            _sync_mirror(callbacks)
            folder.invocation["outcome"] = "interrupted" if stop.signum == signal.SIGINT else "preempted"
            folder.invocation["stopped"] = STOPPED_BY[stop.signum]
            return folder.invocation["outcome"]
        switched_here = True
        for outcome, ended in (("pruned", pruned(extra)), ("stopped_early", parts.stopped_early(extra))):
            if ended:
                mark_ended(folder.backup_dir, outcome)  # a resume after a kill from here only evaluates
                _sync_mirror(callbacks)
                return outcome  # no fine-tuning phase after an early stop or a pruning
    return "completed"


def sweep_job() -> int | None:
    """This job's number when Hydra runs it as part of a multirun (`-m`), else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return int(HydraConfig.get().job.num)


def how_to_continue(settings: Config, run_dir: Path) -> str:
    """What to run after Ctrl-C or SIGTERM stopped a job of a sweep, which stops too, as the words after "To
    continue, ": an Optuna trial is run again by the sweep command (`resume=` would train it outside its study);
    a grid job is resumed, and the jobs after it did not run."""
    if settings.trial.number is not None:
        return f"rerun the sweep command: its study runs trial {settings.trial.number} again"
    return f"run: python run.py resume={run_dir} (the sweep's jobs after job {sweep_job()} did not run)"


def _sync_mirror(callbacks: list[keras.callbacks.Callback]) -> None:
    """AIP_CHECKPOINT_DIR's copy of the backup that a stop or an early end has just committed, which no epoch
    end copies."""
    for callback in callbacks:
        if isinstance(callback, Mirror):
            callback.sync()


def _start_phase(
    settings: Config, plan: Plan, model: keras.Model, phase: Phase, state_batch: tuple[tf.Tensor, tf.Tensor]
) -> None:
    """Freezes what the phase freezes and compiles for its epochs (its step functions' state built from
    `state_batch` before `fit`, so each is traced once), logging both."""
    if fine_tunes(settings):
        trainable = set_trainable(model, phase.unfreeze_from)
        log.info(
            "Epochs %d-%d: %d base layers train, lr x %g <finetune.unfreeze_from=%s>",
            phase.start + 1,
            phase.end,
            len(trainable),
            phase.lr_scale,
            phase.unfreeze_from,
        )
    with plan.strategy.scope():
        compile_phase(model, settings, plan.lr * phase.lr_scale, plan.steps_per_epoch, phase.end - phase.start)
    build_step_state(model, state_batch)
    schedule = settings.optimizer.schedule.name
    if len(plan.phases) > 1 and settings.optimizer.schedule.steps_the_rate:
        log.info(
            "Epochs %d-%d: the %s schedule starts again from lr %g over these %d epochs <optimizer.schedule.name=%s>",
            phase.start + 1,
            phase.end,
            schedule,
            plan.lr * phase.lr_scale,
            phase.end - phase.start,
            schedule,
        )
    _log_xla(model, settings.trainer.jit_compile)
