"""The state-of-the-art training options: Keras's augmentation policies and random erasing (training only, never
saved), MixUp and CutMix (labels mixed with the images), EMA of the weights (validation and checkpoints use it),
gradient accumulation (N micro-batches update like one batch N times larger) and flip test-time augmentation."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_MODEL, cifar_overrides, compose, csv_rows, run_cli, tiny_overrides, write_cifar
from trainer.config.store import to_settings
from trainer.data.augmentation import Augmentation, Policy
from trainer.data.mixing import Mixing, mix_batch, with_class_weights
from trainer.models.preprocessing import build_models, inner_layers
from trainer.models.tta import with_tta
from trainer.runs import checkpoints
from trainer.runs.history import columns, read_rows
from trainer.training.callbacks import Checkpoints, averaged_weights
from trainer.training.compiling import build_phase_optimizer, compile_model

CLASSES = 10


def _batch(seed: int = 0, size: int = CLASSES):
    """`size` random images with the distinct labels 0..size-1, so a mixed label names both of its images."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size, 32, 32, 3), dtype=np.uint8), np.arange(size, dtype=np.int32)


def _partners(soft: np.ndarray) -> list[tuple[int, float]]:
    """(partner, own weight) of each image from its soft label: the other class that holds the rest."""
    result = []
    for index, label in enumerate(soft):
        others = [(weight, cls) for cls, weight in enumerate(label) if cls != index and weight > 0]
        result.append((max(others)[1] if others else index, float(label[index])))
    return result


# --- MixUp and CutMix -------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_mixup_labels_sum_to_one_and_each_image_is_the_same_convex_combination():
    images, labels = _batch()
    mixed, soft = mix_batch(tf.constant(images), tf.constant(labels), tf.constant(3, tf.int64), Mixing(CLASSES, 0.4))
    mixed, soft = mixed.numpy(), soft.numpy()
    assert mixed.dtype == np.float32 and soft.shape == (CLASSES, CLASSES)
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    weights = []
    for index, (partner, weight) in enumerate(_partners(soft)):
        assert np.count_nonzero(soft[index]) <= 2, "a label mixes two classes at most"
        expected = weight * images[index].astype(np.float32) + (1 - weight) * images[partner].astype(np.float32)
        np.testing.assert_allclose(mixed[index], expected, atol=1e-3)
        weights.append(weight)
    assert any(0.05 < weight < 0.95 for weight in weights), "some images are really mixed"


@pytest.mark.unit
def test_cutmix_label_weight_is_the_pasted_area():
    # Each image one flat colour, so the pixels pasted from the partner are exactly those of its colour.
    images = np.repeat(np.arange(CLASSES, dtype=np.uint8)[:, None, None, None] * 20 + 10, 32, axis=1)
    images = np.repeat(np.repeat(images, 32, axis=2), 3, axis=3)
    labels = np.arange(CLASSES, dtype=np.int32)
    for seed in range(5):
        mixed, soft = mix_batch(
            tf.constant(images), tf.constant(labels), tf.constant(seed, tf.int64), Mixing(CLASSES, cutmix_alpha=1.0)
        )
        mixed, soft = mixed.numpy(), soft.numpy()
        np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
        for index, (partner, weight) in enumerate(_partners(soft)):
            own = np.mean(mixed[index] == images[index])
            assert own == pytest.approx(weight, abs=1e-6), (seed, index)
            if partner != index:
                assert np.mean(mixed[index] == images[partner]) == pytest.approx(1 - weight, abs=1e-6)


@pytest.mark.unit
def test_an_image_left_unmixed_keeps_its_pixels_and_a_one_hot_label():
    images, labels = _batch(1, 8)
    mixing = Mixing(CLASSES, mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.5)
    mixed, soft = mix_batch(tf.constant(images), tf.constant(labels), tf.constant(7, tf.int64), mixing)
    kept = [index for index in range(8) if soft.numpy()[index, index] == 1.0]
    assert 0 < len(kept) < 8, "mix_prob=0.5 leaves some images alone and mixes others"
    for index in kept:
        np.testing.assert_array_equal(mixed.numpy()[index], images[index])


@pytest.mark.unit
def test_mixing_replays_from_the_batch_seed_alone():
    images, labels = _batch(2)
    mixing = Mixing(CLASSES, mixup_alpha=0.8, cutmix_alpha=1.0)
    first = mix_batch(tf.constant(images), tf.constant(labels), tf.constant(11, tf.int64), mixing)
    second = mix_batch(tf.constant(images), tf.constant(labels), tf.constant(11, tf.int64), mixing)
    other = mix_batch(tf.constant(images), tf.constant(labels), tf.constant(12, tf.int64), mixing)
    np.testing.assert_array_equal(first[1].numpy(), second[1].numpy())
    assert not np.array_equal(first[1].numpy(), other[1].numpy())


@pytest.mark.unit
def test_class_weights_of_a_mixed_label_are_its_weighted_mean():
    soft = np.array([[0.7, 0.3, 0.0], [0.0, 0.0, 1.0]], np.float32)
    dataset = with_class_weights(tf.data.Dataset.from_tensors((np.zeros((2, 1), np.float32), soft)), {0: 1, 1: 3, 2: 2})
    _, _, weights = next(iter(dataset))
    np.testing.assert_allclose(weights.numpy(), [0.7 * 1 + 0.3 * 3, 2.0], rtol=1e-6)


# --- policies in the training wrapper only ----------------------------------------------------------------------


def _network():
    """Every pixel reaches the output (no pooling), so a changed pixel changes the probabilities."""
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Flatten()(keras.layers.Conv2D(4, 3)(inputs))
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(x), name="net")


@pytest.mark.unit
@pytest.mark.parametrize(
    "augment, names",
    [
        (Augmentation(policy=Policy.randaugment, random_erasing=0.5), {"rand_augment", "random_erasing"}),
        (Augmentation(policy=Policy.augmix, policy_magnitude=0.5), {"aug_mix"}),
    ],
    ids=["randaugment+erasing", "augmix"],
)
def test_policy_layers_act_in_training_only_and_stay_out_of_the_inference_model(augment, names):
    models = build_models(_network(), "standardize", augment, seed=1)
    training = {layer.name for layer in inner_layers(models.training)}
    inference = {layer.name for layer in inner_layers(models.inference)}
    assert names <= training and not names & inference
    images = _batch(3, 8)[0]
    plain = models.inference.predict(images, verbose=0)
    np.testing.assert_allclose(models.training(images, training=False).numpy(), plain, atol=1e-6)
    augmented = models.training(images, training=True).numpy()
    assert np.abs(augmented - plain).max() > 1e-3, "the policy changes what the network sees in training"


# --- EMA ----------------------------------------------------------------------------------------------------------


class _Record(keras.callbacks.Callback):
    """The model's trained weights and the optimizer's averages at each epoch end (after the checkpoint)."""

    def __init__(self):
        super().__init__()
        self.raw, self.average = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.raw.append([v.numpy().copy() for v in self.model.trainable_variables])
        with averaged_weights(self.model):
            self.average.append([v.numpy().copy() for v in self.model.trainable_variables])


@pytest.mark.unit
def test_ema_checkpoints_hold_the_averaged_weights_which_differ_from_the_trained_ones(tmp_path):
    models = build_models(_network())
    model = models.training
    model.compile(
        optimizer=keras.optimizers.SGD(0.5, use_ema=True, ema_momentum=0.8), loss="sparse_categorical_crossentropy"
    )
    images, labels = _batch(4, 32)
    info = checkpoints.ModelInfo(tuple(str(index) for index in range(CLASSES)), 32, 32, "standardize")
    record = _Record()
    saver = Checkpoints(tmp_path, models.inference, info, "loss", "min", ema=True)
    model.fit(images, labels % CLASSES, batch_size=8, epochs=1, callbacks=[saver, record], verbose=0)
    saved = keras.saving.load_model(tmp_path / "last.keras", compile=False)
    saved_weights, trained, average = saved.get_weights(), record.raw[-1], record.average[-1]
    assert max(np.abs(a - r).max() for a, r in zip(average, trained, strict=True)) > 1e-4, (
        "EMA differs from the trained weights"
    )
    kernels = [w for w in saved_weights if w.ndim == 4]  # the conv kernel, in both
    np.testing.assert_allclose(kernels[0], [w for w in average if w.ndim == 4][0], atol=1e-7)


@pytest.mark.integration
def test_an_ema_run_validates_and_checkpoints_the_same_averaged_weights(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=16, num_test=16)
    run = tmp_path / "run"
    overrides = [*tiny_overrides(data), "trainer.epochs=2", "optimizer.ema_momentum=0.7", "optimizer.lr=0.05"]
    result = run_cli([*overrides, f"hydra.run.dir={run}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EMA of the weights (momentum 0.7)" in result.stdout + result.stderr
    history = columns(read_rows(run / "history.csv"))
    metrics = json.loads((run / "metrics.json").read_text())
    evaluated = tmp_path / "evaluated"
    result = run_cli(
        [*overrides, "mode=evaluate", f"checkpoint={run}", "evaluate.split=val", f"hydra.run.dir={evaluated}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    val = json.loads((evaluated / "metrics.json").read_text())
    # best.keras evaluated again gives the validation loss of its epoch: validation ran on the weights saved.
    assert val["loss"] == pytest.approx(history["val_loss"][metrics["best_epoch"] - 1], abs=1e-5)


# --- gradient accumulation ---------------------------------------------------------------------------------------


def _dense_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


def _accumulated_update(strategy: tf.distribute.Strategy, accumulate: int, batch: int, steps: int) -> list:
    """The weights after `steps` steps of `batch` examples with `trainer.grad_accum_steps=accumulate`."""
    overrides = ["optimizer=sgd", "optimizer.schedule.name=constant", f"trainer.grad_accum_steps={accumulate}"]
    settings = to_settings(compose(overrides))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype(np.float32), rng.integers(0, 3, 32)
    with strategy.scope():
        model = _dense_model(5)
        options = settings.optimizer.keras_options()
        compile_model(model, build_phase_optimizer(settings.optimizer._target_, options, 0.3, accumulate))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    return model.get_weights()


@pytest.mark.integration
def test_four_accumulated_micro_batches_update_like_one_batch_four_times_larger():
    whole = _accumulated_update(tf.distribute.get_strategy(), 1, 32, 1)
    accumulated = _accumulated_update(tf.distribute.get_strategy(), 4, 8, 4)
    one_micro = _accumulated_update(tf.distribute.get_strategy(), 1, 8, 1)
    for a, b in zip(accumulated, whole, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert max(np.abs(a - b).max() for a, b in zip(one_micro, whole, strict=True)) > 1e-4, "the comparison can fail"


# In a process of its own: TensorFlow numbers the collectives of every MirroredStrategy from the same keys, so
# two mirrored runs of differently shaped models in one process abort each other ("Shape mismatch in the
# collective instance 100"); the other in-process mirrored tests all train the same tiny model.
MIRRORED_ACCUMULATION = """
import json, sys
import conftest  # two logical CPUs
import keras, numpy as np, pytest, tensorflow as tf
from test_training_options import _accumulated_update, _dense_model
from trainer.distribute import strategies

mirrored = strategies.mirrored(cpu_devices=conftest.LOGICAL_CPUS)
whole = _accumulated_update(tf.distribute.get_strategy(), 1, 32, 1)
accumulated = _accumulated_update(mirrored, 4, 8, 4)
with mirrored.scope():  # Keras alone (keras-team/keras#20582)
    model = _dense_model(5)
    model.compile(optimizer=keras.optimizers.SGD(0.3, gradient_accumulation_steps=2), loss="mse")
try:
    model.fit(np.zeros((8, 6), np.float32), np.zeros((8, 3), np.float32), batch_size=4, verbose=0)
    keras_alone = "trained"
except RuntimeError as error:
    keras_alone = "merge_call" if "merge_call" in str(error) else str(error)
difference = max(float(np.abs(a - b).max()) for a, b in zip(accumulated, whole, strict=True))
print("RESULT " + json.dumps({"difference": difference, "keras_alone": keras_alone}))
"""


@pytest.mark.e2e
def test_accumulation_under_mirrored_updates_like_one_large_batch_where_keras_alone_fails():
    import subprocess
    import sys

    from conftest import ROOT, SUBPROCESS_ENV

    process = subprocess.run(
        [sys.executable, "-c", MIRRORED_ACCUMULATION],
        cwd=ROOT / "tests",
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((line for line in process.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line is not None, process.stderr[-3000:]
    result = json.loads(line[len("RESULT ") :])
    assert result["difference"] <= 1e-5, result  # 4 micro-batches of 8 over 2 replicas = 1 batch of 32
    # When Keras alone trains, upstream fixed keras-team/keras#20582: delete trainer/distribute/accumulation.py.
    assert result["keras_alone"] == "merge_call", result


# --- flip test-time augmentation -------------------------------------------------------------------------------


@pytest.mark.unit
def test_flip_tta_is_the_mean_of_the_image_and_its_mirror():
    model = build_models(_network()).inference
    images = _batch(5, 8)[0]
    expected = (model.predict(images, verbose=0) + model.predict(images[:, :, ::-1], verbose=0)) / 2
    tta = with_tta(model, "flip")
    np.testing.assert_allclose(tta.predict(images, verbose=0), expected, atol=1e-6)
    assert np.abs(expected - model.predict(images, verbose=0)).max() > 1e-5, "the mirror changes the answer"
    assert with_tta(model, "none") is model


@pytest.mark.integration
def test_predict_with_flip_tta_writes_the_mean_probabilities(trained_run, tmp_path):
    data, run = trained_run
    output = tmp_path / "p.csv"
    arguments = [
        "mode=predict",
        f"checkpoint={run}",
        f"predict.input={data / 'test_batch.bin'}",
        f"predict.output={output}",
        "predict.tta=flip",
        f"hydra.run.dir={tmp_path / 'out'}",
    ]
    result = run_cli(arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = csv_rows(output)
    probabilities = np.array([[float(row[key]) for key in row if key.startswith("prob_")] for row in rows])
    records = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(-1, 1 + 3072)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    model, _ = checkpoints.load(run)
    offset = (32 - model.input_shape[1]) // 2  # the evaluation's centre crop (cifar: 28 of 32)
    images = images[:, offset : 32 - offset, offset : 32 - offset]
    expected = (model.predict(images, verbose=0) + model.predict(images[:, :, ::-1], verbose=0)) / 2
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)


EVERY_OPTION = [  # but the policy, which each run picks
    "dataset.augment.random_erasing=0.25",
    "dataset.augment.mixup_alpha=0.2",
    "dataset.augment.cutmix_alpha=1.0",
    "optimizer.ema_momentum=0.9",
    "trainer.grad_accum_steps=2",
    "trainer.label_smoothing=0.1",
    "trainer.class_weight=balanced",
    "evaluate.tta=flip",
]


@pytest.mark.integration
@pytest.mark.slow  # each option trains in the default suite (test_options.py); all at once here
def test_a_run_with_every_option_trains_and_saves_no_training_layer(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=16, num_test=16)
    run = tmp_path / "run"
    overrides = [
        *[item for item in tiny_overrides(data) if item not in TINY_MODEL],  # VGG19: batch norm, dropout
        "dataset.augment.policy=randaugment",
        *EVERY_OPTION,
        f"hydra.run.dir={run}",
    ]
    result = run_cli(overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Effective global batch 16 = 2 accumulated batches x 8" in result.stdout + result.stderr
    assert "with flip TTA" in result.stdout + result.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test_tta"] == "flip"
    saved = keras.saving.load_model(run / "checkpoints" / "best.keras", compile=False, safe_mode=True)
    names = {layer.name for layer in inner_layers(saved)}
    assert not names & {"rand_augment", "random_erasing", "random_flip", "random_brightness", "random_contrast"}
    assert saved.inputs[0].dtype == "uint8", "the deployed model takes uint8 even when training took mixed floats"


@pytest.mark.unit
def test_inspect_captions_a_mixed_label_with_both_classes():
    from trainer.tasks.inspect import _caption

    names = ["cat", "dog", "fox"]
    assert _caption(np.int32(1), names) == "dog"
    assert _caption(np.array([0.7, 0.3, 0.0]), names) == "cat 70%/dog 30%"
    assert _caption(np.array([0.0, 0.999, 0.001]), names) == "dog"


@pytest.mark.integration
@pytest.mark.slow  # ~9 s alone; each of its options has its own default test
def test_the_modern_preset_runs_end_to_end(tmp_path):
    data = write_cifar(tmp_path / "cifar", records_per_file=16, num_test=16)
    overrides = ["experiment=cifar_vgg19_modern", *cifar_overrides(data), f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_cli(overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test_tta"] == "flip" and metrics["epochs_completed"] == 1
    log = (tmp_path / "run" / "run.log").read_text()
    assert "warmup_epochs=5 is not shorter than trainer.epochs=1: warming up over 0.1 epoch(s)" in log
    assert "The run makes 2 updates, and an EMA of momentum 0.9998 still holds 100% of the initial weights" in log
    assert "2 steps per epoch <trainer.batch_size=8 trainer.steps_per_epoch=2>" in log
    assert "Model input 32x32 <dataset.image_size=32>" in log  # the preset pads and crops back to 32


@pytest.mark.slow  # 32 s; every option trains in one process in the default suite
@pytest.mark.e2e
def test_every_option_trains_under_mirrored(tmp_path):
    """The policies, mixing, EMA, accumulation and TTA under `strategy=mirrored`, in a real process (see
    MIRRORED_ACCUMULATION for why not in this one)."""
    from conftest import run_py

    data = write_cifar(tmp_path / "cifar", records_per_file=16, num_test=16)
    run = tmp_path / "run"
    arguments = [
        *[item for item in tiny_overrides(data) if item != "trainer.epochs=1"],
        "strategy=mirrored",
        "strategy.cpu_devices=2",
        "dataset.augment.policy=augmix",
        *EVERY_OPTION,
        "trainer.epochs=2",
        f"hydra.run.dir={run}",
    ]
    process = run_py(arguments, cwd=tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["test_tta"] == "flip" and metrics["epochs_completed"] == 2
