"""What a run costs: its memory estimate before the first step (refused above what the machine has, warned near
it, within 30% of the measured peak RSS), its time after the first steps and epoch; mirrored on a CPU."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import keras
import pytest

from conftest import ROOT, SUBPROCESS_ENV, compose, run_cli
from trainer.config import to_settings
from trainer.tasks.runtime import build_strategy
from trainer.training import cost


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.unit
def test_the_time_per_epoch_and_for_the_run_is_said_after_the_first_steps_and_again_after_the_first_epoch(caplog):
    caplog.set_level(logging.INFO, logger="trainer.training.cost")
    clock = Clock()
    timer = cost.RunTime(steps_per_epoch=600, epochs=30, first_epoch=0, clock=clock)
    timer.on_epoch_begin(0)
    clock.now += 12.0  # the first step traces: left out
    timer.on_train_batch_end(0)
    for step in (1, 2, 3):
        clock.now += 1.0
        timer.on_train_batch_end(step)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "~10 min per epoch (1 s per step x 600 steps), ~5.0 h for 30 epochs (trainer.epochs); validation comes on top"
    ]
    for step in range(4, 600):
        clock.now += 1.0
        timer.on_train_batch_end(step)
    timer.on_test_begin()
    clock.now += 20.0  # the first validation step traces too
    timer.on_test_batch_end(0)
    for batch in (1, 2, 3):
        clock.now += 2.0
        timer.on_test_batch_end(batch)
    clock.now += 30.0  # saving
    timer.on_epoch_end(0)
    # 12 + 599 + 26 + 30 s, less 11 s of the first step's tracing and 18 s of the first validation step's: 638 s
    said = caplog.records[-1].getMessage()
    assert said == (
        "After epoch 1: ~11 min per epoch (validation included, tracing left out), ~5.1 h for the 29 epochs left "
        "of 30 (trainer.epochs)"
    )
    timer.on_epoch_end(1)
    assert len(caplog.records) == 2, "once per fit"
    resumed = cost.RunTime(steps_per_epoch=10, epochs=30, first_epoch=20, clock=clock)
    resumed.on_epoch_begin(20)
    for step in range(5):
        clock.now += 1.0
        resumed.on_train_batch_end(step)
    said = caplog.records[-1].getMessage()
    assert said.startswith("~10 s per epoch (1 s per step x 10 steps), ~2 min for the 10 epochs left of 30")


@pytest.mark.unit
def test_the_estimate_counts_every_layers_output_for_the_batch_and_the_weights_copies():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)  # 8 x 8 x 4 = 256 values
    outputs = keras.layers.Dense(2, name="dense")(keras.layers.Flatten()(x))  # 256 + 2
    model = keras.Model(inputs, outputs)
    assert cost.values_per_image(model) == 256 + 256 + 2
    estimate = cost.estimate_memory(model, batch=10, bytes_per_value=4, slots=2, pipeline_bytes=1e6, process_bytes=5e8)
    assert estimate.activations == cost.ACTIVATION_FACTOR * 514 * 4 * 10
    weights = 3 * 3 * 3 * 4 + 4 + 256 * 2 + 2
    assert estimate.state == 4 * weights * 3 + cost.TRACING_BYTES  # gradients and Adam's two moments
    assert estimate.total == 5e8 + 1e6 + estimate.activations + estimate.state
    assert cost.optimizer_slots("sgd", momentum=0.9, ema=True) == 2 and cost.optimizer_slots("sgd") == 0
    # 1 GB of activations at batch 64 (15.6 MB an image): 64 do not fit in 2 GB with 1 GB held, 32 do
    big = cost.MemoryEstimate(process=0.9e9, activations=1e9, state=0.1e9, pipeline=0.0)
    assert cost.fitting_batch(big, 64, available=2e9) == 32
    assert cost.fitting_batch(big, 64, available=1e9) == 0
    assert cost.fitting_batch(big, 64, available=2e9, multiple=64) == 0


@pytest.mark.integration
def test_a_run_that_needs_more_memory_than_the_machine_has_is_one_line_with_the_settings_that_fit(tmp_path):
    """The issue's run: full-width VGG19 at 128x128 with a batch of 1024 needs ~100 GB; this machine has less."""
    typed = ["debug=smoke", "model.width_multiplier=1.0", "dataset.image_size=128", "trainer.batch_size=1024"]
    result = run_cli([*typed, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith("error: this run needs ~"), result.stderr[-2000:]
    line = lines[-1]
    assert "of memory (batch 1024 at 128x128, vgg19 of 20," in line and "GB is available of RAM" in line
    batch = int(re.search(r"settings that fit: trainer.batch_size=(\d+)", line).group(1))
    assert 1 <= batch < 1024 and batch & (batch - 1) == 0, line
    assert "dataset.image_size=96 model.width_multiplier=0.25 trainer.batch_size=32 (experiment=photos_quick)" in line
    assert not (tmp_path / "run" / "checkpoints").exists(), "refused before anything trained"


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_near_the_memory_available_is_warned_about(tmp_path, monkeypatch):
    needs = {}

    def available():  # the estimate's 1.1 times, less what the process holds: between 80% and 100% of it
        return needs.setdefault("bytes", 0.0)

    original = cost.estimate_memory

    def estimate(*args, **kwargs):
        result = original(*args, **kwargs)
        needs["bytes"] = result.total * 1.1 - result.process
        return result

    monkeypatch.setattr(cost, "available_ram", available)
    monkeypatch.setattr(cost, "estimate_memory", estimate)
    result = run_cli(["debug=smoke", "trainer.epochs=1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    warned = [line for line in result.stdout.splitlines() if "close to the limit" in line]
    assert len(warned) == 1 and "This run needs ~" in warned[0], result.stderr[-2000:]


@pytest.mark.unit
def test_mirrored_without_a_gpu_says_it_has_one_replica(caplog):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is here")
    caplog.set_level(logging.WARNING, logger="trainer.tasks.runtime")
    # The tests' process splits the CPU in two (conftest); a user's has one CPU device, as this names it
    strategy = build_strategy(to_settings(compose(["strategy=mirrored", "strategy.devices=[/cpu:0]"])).strategy)
    assert strategy.num_replicas_in_sync == 1
    said = [record.getMessage() for record in caplog.records if "strategy=mirrored" in record.getMessage()]
    assert said == [
        "strategy=mirrored found no GPU: it mirrors over one replica, the CPU, as strategy=single does "
        "(strategy.cpu_devices=N splits the CPU into N, for tests)"
    ]


SIZES = [  # image size, width, batch, precision (auto: mixed_bfloat16 on a CPU with AVX512-BF16)
    ("64", "1.0", "64", "auto"),
    ("96", "1.0", "16", "auto"),
    ("128", "0.5", "32", "auto"),
    ("128", "0.5", "32", "float32"),
]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("size, width, batch, precision", SIZES, ids=["-".join(size) for size in SIZES])
def test_the_memory_estimate_is_within_30_percent_of_the_peak_rss(tmp_path, size, width, batch, precision):
    """A real process each (its own peak RSS): VGG19 on the digits, 4 steps."""
    run = tmp_path / "run"
    arguments = [
        f"dataset.image_size={size}", f"model.width_multiplier={width}", f"trainer.batch_size={batch}",
        f"trainer.precision={precision}", "trainer.steps_per_epoch=4", "trainer.epochs=1", "evaluate.report=false",
        "logger=csv", f"hydra.run.dir={run}",
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *arguments],
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    stderr = process.stderr.read().decode(errors="replace")
    assert status == 0, stderr[-3000:]
    peak = usage.ru_maxrss * 1024  # kilobytes on Linux
    said = re.search(r"Memory: ~([\d.]+) GB needed", (run / "run.log").read_text())
    assert said, stderr[-3000:]
    estimate = float(said.group(1)) * 1e9
    assert abs(estimate - peak) <= 0.3 * peak, f"estimate {estimate / 1e9:.2f} GB, peak RSS {peak / 1e9:.2f} GB"
