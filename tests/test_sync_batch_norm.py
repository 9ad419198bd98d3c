"""Batch norm over the global batch: synchronized on more than one replica, plain on one.

Under a strategy with two replicas each replica sees half of the batch; plain batch norm would
normalize (and update its moving variance) with the statistics of that half. The two-replica cases run
in subprocesses: the CPU must be split into logical devices before TensorFlow starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from conftest import ROOT, compose, run_py, write_cifar
from trainer.config import to_settings
from trainer.runs import checkpoints
from trainer.tasks import run_task
from trainer.tasks.train import build_network

SMALL = ["dataset=cifar", "dataset.val_size=16", "debug=smoke", "trainer.batch_size=16", "trainer.steps_per_epoch=2"]


def _batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    from trainer.models.preprocessing import inner_layers

    return [layer for layer in inner_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


@pytest.mark.unit
@pytest.mark.parametrize("replicas", [1, 2])
def test_vgg19_batch_norm_is_synchronized_exactly_on_more_than_one_replica(replicas):
    settings = to_settings(compose(["debug=smoke"]))
    data = SimpleNamespace(class_names=[str(index) for index in range(10)], input_shape=(32, 32, 3))
    layers = _batch_norm_layers(build_network(settings, data, replicas))
    assert len(layers) == 18  # 16 convolutions and fc1, fc2
    assert {layer.synchronized for layer in layers} == {replicas > 1}


@pytest.mark.integration
@pytest.mark.slow
def test_mirrored_run_saves_synchronized_batch_norm_that_loads_and_evaluates_on_one_device(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    run_dir = tmp_path / "mirrored"
    args = [*SMALL, f"dataset.data_dir={data}", "strategy=mirrored", "strategy.cpu_devices=2"]
    result = run_py([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 replica(s)" in result.stdout + result.stderr
    model, _ = checkpoints.load(run_dir)  # safe mode, this process: one device
    layers = _batch_norm_layers(model)
    assert layers and all(layer.synchronized for layer in layers)
    # Evaluated again here on one device, the saved model gives the figures the mirrored run wrote.
    trained = json.loads((run_dir / "metrics.json").read_text())
    evaluate_dir = tmp_path / "evaluate"
    overrides = [*SMALL, f"dataset.data_dir={data}", "mode=evaluate", "evaluate.split=test", f"checkpoint={run_dir}"]
    run_task(compose(overrides, evaluate_dir), overrides=overrides)
    again = json.loads((evaluate_dir / "metrics.json").read_text())
    assert again["num_examples"] == trained["num_examples"]["test"]
    assert again["accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-6)
    assert again["loss"] == pytest.approx(trained["test_loss"], rel=1e-4)


# One training step of batch norm on a batch of 8 whose halves differ: on 2 replicas (4 each), and on one
# device with the whole batch. Prints the moving statistics as JSON.
ONE_STEP = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras
    import tensorflow as tf
    from trainer.distribute.strategies import mirrored

    strategy = mirrored(cpu_devices=2)
    rng = np.random.default_rng(0)
    batch = np.concatenate([rng.normal(0, 1, (4, 3)), rng.normal(5, 2, (4, 3))]).astype("float32")

    def moving(layer):
        return [np.asarray(keras.ops.convert_to_numpy(v)).tolist() for v in (layer.moving_mean, layer.moving_variance)]

    result = {}
    for synchronized in (True, False):
        with strategy.scope():
            layer = keras.layers.BatchNormalization(momentum=0.5, synchronized=synchronized)
            layer.build((None, 3))
        halves = strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(np.split(batch, 2)[context.replica_id_in_sync_group])
        )
        tf.function(lambda x: strategy.run(lambda half: layer(half, training=True), args=(x,)))(halves)
        result[f"replicas_2_synchronized_{synchronized}"] = moving(layer)
    whole = keras.layers.BatchNormalization(momentum=0.5)
    whole(batch, training=True)
    result["one_device"] = moving(whole)
    print(json.dumps(result))
    """
)


@pytest.mark.e2e
@pytest.mark.slow
def test_synchronized_batch_norm_on_two_replicas_updates_like_one_device_on_the_whole_batch(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", ONE_STEP], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = {key: np.array(value) for key, value in json.loads(result.stdout.splitlines()[-1]).items()}
    reference = figures["one_device"]
    np.testing.assert_allclose(figures["replicas_2_synchronized_True"], reference, rtol=1e-5, atol=1e-5)
    # The control: unsynchronized, each replica uses its own half's statistics, and the moving statistics kept
    # are a half's (measured: mean ~0.03 against 1.1, variance ~0.7 against 3-5, the spread between halves lost).
    mean, variance = figures["replicas_2_synchronized_False"]
    assert np.min(np.abs(reference[0] - mean)) > 0.5
    assert np.min(reference[1] - variance) > 1.0


@pytest.mark.integration
def test_synchronized_batch_norm_model_saves_loads_in_safe_mode_and_exports(tmp_path: Path):
    from trainer.models.preprocessing import build_models
    from trainer.models.vgg19 import build_vgg19

    network = build_vgg19(10, width_multiplier=0.125, fc_units=16, batch_norm=True, synchronized_batch_norm=True)
    model = build_models(network).inference
    info = checkpoints.ModelInfo(tuple(str(index) for index in range(10)), 32, 32, "standardize")
    checkpoints.save(model, tmp_path / "sync.keras", info)
    loaded, _ = checkpoints.load(tmp_path / "sync.keras")
    assert all(layer.synchronized for layer in _batch_norm_layers(loaded))
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    expected = model.predict(images, verbose=0)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, atol=1e-6)
    # ... and exports for serving (outside any strategy), giving the same probabilities.
    import tensorflow as tf

    from trainer.serving.saved_model import write_saved_model

    served = tf.saved_model.load(str(write_saved_model(loaded, tmp_path / "export", info)))
    probabilities = served.signatures["serve"](images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)


@pytest.mark.e2e
@pytest.mark.slow
def test_two_workers_with_synchronized_batch_norm_end_with_identical_weights(tmp_path):
    """Unsynchronized, each worker kept the moving statistics of its own share and the weights differed
    (test_distribute turns batch norm off for its bit-for-bit check); synchronized, they are the same."""
    from test_distribute import _start_workers

    data = write_cifar(tmp_path / "cifar")
    workers = _start_workers(tmp_path, data, "trainer.epochs=1")  # batch norm on: the default
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    fingerprints = [re.findall(r"Final weights sha256 (\w+)", output) for output in outputs]
    assert fingerprints[0] and fingerprints[0] == fingerprints[1]


def _all_reduce_calls(monkeypatch) -> list[int]:
    """Counts each replica's `all_reduce` calls (a list of tensors is one call, packed into one collective)."""
    import tensorflow as tf

    calls = []
    original = tf.distribute.ReplicaContext.all_reduce

    def counted(self, reduce_op, value, options=None):
        calls.append(1)
        return original(self, reduce_op, value, options)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", counted)
    return calls


@pytest.mark.unit
def test_the_fused_moments_give_kerass_sums_with_one_all_reduce_instead_of_three(monkeypatch):
    """Each multi-worker collective leaks upstream (ledger row 17): batch norm's three all-reduces go as one."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import nn

    from trainer.distribute import fused_moments

    # Reduced on one device: no collective of this test meets another test's in this process.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], tf.distribute.ReductionToOneDevice())
    images = tf.random.stateless_normal([2, 4, 6, 6, 3], seed=[1, 2])  # one batch a replica
    calls = _all_reduce_calls(monkeypatch)
    results, counts = {}, {}
    for name, moments in (("keras", nn._compute_moments_sync), ("fused", fused_moments._compute_moments_sync)):

        def replica(moments=moments):
            own = images[tf.distribute.get_replica_context().replica_id_in_sync_group]
            return moments(own, [0, 1, 2], False)

        calls.clear()
        results[name] = [strategy.experimental_local_results(value) for value in tf.function(
            lambda replica=replica: strategy.run(replica))()]  # fmt: skip
        counts[name] = len(calls)
    assert counts == {"keras": 6, "fused": 2}, "two replicas: three all-reduces each, then one"
    for keras_values, fused_values in zip(results["keras"], results["fused"], strict=True):
        for a, b in zip(keras_values, fused_values, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    whole = tf.reshape(images, [-1, 3])
    np.testing.assert_allclose(results["fused"][0][0].numpy(), tf.reduce_mean(whole, 0).numpy(), rtol=1e-5)
    monkeypatch.setattr(nn, "_compute_moments_sync", nn._compute_moments_sync)  # restored after the test
    monkeypatch.setattr(fused_moments, "_applied", False)
    assert fused_moments.apply() and nn._compute_moments_sync is fused_moments._compute_moments_sync
