"""The training task: data, model and optimizer from the config, Keras `fit`, then the test split.

    python run.py                      # VGG19 on the bundled digits
    python run.py dataset=cifar dataset.data_dir=/data/cifar10

The run folder gets checkpoints/{best,last}.keras, history.csv, tensorboard/
and metrics.json. `train` returns the objective (best `objective.metric`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import keras

from trainer import distribute, optim
from trainer.callbacks import training_callbacks
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.models.vgg19 import build_vgg19
from trainer.reports import write_json
from trainer.tasks.data import load_data

log = logging.getLogger(__name__)

METRICS = ("loss", "accuracy")


def _compile(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _objective_metric(settings: Config) -> str:
    metric = settings.objective.metric
    names = [*METRICS, *(f"val_{name}" for name in METRICS)]
    if metric not in names:
        raise ConfigError(f"objective.metric must be one of {names}; got {metric!r}")
    return metric


def train(settings: Config) -> float:
    """Trains, evaluates the best checkpoint on the test split and writes metrics.json.

    Returns:
        The best value of `objective.metric` over the epochs, as a plain float.
    """
    run_dir = Path(settings.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metric = _objective_metric(settings)
    keras.utils.set_random_seed(settings.seed)
    strategy = distribute.build_strategy(**vars(settings.strategy))
    batch = settings.trainer.batch_size
    per_replica = distribute.per_replica_batch(batch, strategy)
    data = load_data(settings.dataset, batch, settings.seed)
    steps_per_epoch = settings.trainer.steps_per_epoch or data.num_examples["train"] // batch
    if steps_per_epoch < 1:
        raise ConfigError(
            f"trainer.batch_size={batch} is larger than the {data.num_examples['train']} training records"
        )
    log.info(
        "Global batch %d, %d per replica, %d steps per epoch <trainer.batch_size=%d>",
        batch,
        per_replica,
        steps_per_epoch,
        batch,
    )

    with strategy.scope():
        model = build_vgg19(
            num_classes=len(data.class_names),
            input_shape=data.input_shape,
            width_multiplier=settings.model.width_multiplier,
            fc_units=settings.model.fc_units,
            dropout=settings.model.dropout,
            weight_decay=settings.model.weight_decay,
            batch_norm=settings.model.batch_norm,
        )
        opt = settings.optimizer
        learning_rate = optim.build_learning_rate(
            opt.schedule.name,
            opt.lr,
            steps_per_epoch,
            settings.trainer.epochs,
            warmup_epochs=opt.schedule.warmup_epochs,
            alpha=opt.schedule.alpha,
            boundaries=list(opt.schedule.boundaries),
            factor=opt.schedule.factor,
        )
        _compile(
            model,
            optim.build_optimizer(
                opt.name,
                learning_rate,
                opt.momentum,
                opt.nesterov,
                opt.weight_decay,
                opt.clipnorm,
            ),
        )
    log.info(
        "Model %s: %s parameters, input %s <model=%s>",
        model.name,
        f"{model.count_params():,}",
        data.input_shape,
        settings.model.name,
    )

    started = time.perf_counter()
    history = model.fit(
        data.train,
        epochs=settings.trainer.epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=data.val,
        callbacks=training_callbacks(run_dir, metric, settings.objective.mode),
        verbose=settings.trainer.verbose,
        shuffle=False,  # the pipeline shuffles, seeded
    )
    seconds = time.perf_counter() - started
    values = history.history[metric]
    pick = max if settings.objective.mode == "max" else min
    best_epoch = values.index(pick(values))

    best = run_dir / "checkpoints" / "best.keras"
    with strategy.scope():
        best_model = keras.saving.load_model(best, safe_mode=True)
    test = best_model.evaluate(data.test, verbose=0, return_dict=True)
    metrics = {
        "objective": float(values[best_epoch]),
        "objective_metric": metric,
        "best_epoch": best_epoch + 1,
        "epochs_completed": len(values),
        "val_accuracy": float(history.history["val_accuracy"][best_epoch]),
        "val_loss": float(history.history["val_loss"][best_epoch]),
        "test_accuracy": float(test["accuracy"]),
        "test_loss": float(test["loss"]),
        "train_seconds": round(seconds, 2),
        "train_images_per_second": round(len(values) * steps_per_epoch * batch / seconds, 1),
        "num_examples": data.num_examples,
    }
    write_json(run_dir / "metrics.json", metrics)
    log.info(
        "Test accuracy %.4f, test loss %.4f (best epoch %d by %s) in %.0f s",
        metrics["test_accuracy"],
        metrics["test_loss"],
        best_epoch + 1,
        metric,
        seconds,
    )
    return metrics["objective"]
