"""The from-scratch presets learn in a few epochs on synthetic CIFAR-format data: `dataset=cifar` with every
default of its pipeline and model (random crop, flip, colour jitter, per-image standardization; VGG19 with batch
norm at momentum 0.9, Adam) and `experiment=cifar_vgg19` (pad-and-crop, SGD at 0.1 for batch 128).

The images are stripes: the class is their orientation and frequency, which survives what CIFAR's augmentation
and standardization do to a photo (a crop moves them, a flip mirrors them, jitter and standardization change their
level and contrast), under a random phase, tint and noise per image. Each case trains a quarter-width VGG19 on 576
records (about a minute or two on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import CIFAR_TRAIN, check_run_metrics, compose
from trainer.runs.history import columns, read_rows
from trainer.tasks import run_task

pytestmark = pytest.mark.integration

EPOCHS = 8


def stripes(labels: np.ndarray, rng: np.random.Generator) -> bytes:
    """CIFAR-10 records (label byte, then the R, G and B planes) of class-coded stripes: classes 0-4 horizontal,
    5-9 vertical, with 1 to 5 periods across the image; random phase, tint and noise per image."""
    axis = np.arange(32, dtype=np.float64)
    records = []
    for label in labels:
        periods, vertical = 1 + label % 5, label >= 5
        wave = np.sin(2 * np.pi * periods * axis / 32 + rng.uniform(0, 2 * np.pi))
        plane = np.tile(wave[None, :], (32, 1)) if vertical else np.tile(wave[:, None], (1, 32))
        tint = rng.uniform(0.4, 1.0, 3)[:, None, None]
        pixels = 128 + 70 * tint * plane[None] + rng.normal(0, 25, (3, 32, 32))
        records.append(bytes([int(label)]) + np.clip(pixels, 0, 255).astype(np.uint8).tobytes())
    return b"".join(records)


def write_stripes(folder: Path, records_per_file: int, num_test: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name in CIFAR_TRAIN:
        (folder / name).write_bytes(stripes(rng.integers(0, 10, records_per_file), rng))
    (folder / "test_batch.bin").write_bytes(stripes(rng.integers(0, 10, num_test), rng))
    return folder


def stripes_overrides(data: Path, epochs: int) -> list[str]:
    """`dataset=cifar` on the stripes of `write_stripes`, a quarter-width VGG19, `epochs` of 18 steps."""
    return [
        "dataset=cifar",
        f"dataset.data_dir={data}",
        "dataset.val_size=64",
        "model.width_multiplier=0.25",
        f"trainer.epochs={epochs}",
        "trainer.batch_size=32",  # 18 steps per epoch
        "trainer.threads=2",
        "trainer.verbose=0",
    ]


@pytest.mark.slow
# Measured (8 epochs): the defaults reach test 0.98; experiment=cifar_vgg19 0.47 (its SGD recipe with dropout 0.5
# is made for 160 epochs; it is still climbing), and 0.29 at its unscaled lr 0.1 for batch 32.
@pytest.mark.parametrize(
    "preset, bound", [([], 0.8), (["experiment=cifar_vgg19"], 0.4)], ids=["defaults", "experiment=cifar_vgg19"]
)
def test_from_scratch_preset_learns_synthetic_cifar_in_a_few_epochs(tmp_path, preset, bound, caplog):
    caplog.set_level("INFO", logger="trainer.tasks")
    data = write_stripes(tmp_path / "cifar", records_per_file=128, num_test=200)
    overrides = [*preset, *stripes_overrides(data, EPOCHS)]
    run_task(compose(overrides, tmp_path / "run"))
    metrics = check_run_metrics(tmp_path / "run")
    history = columns(read_rows(tmp_path / "run" / "history.csv"))
    print(  # the figures, for `pytest -m slow -rP`
        f"train accuracy {[round(value, 2) for value in history['accuracy']]}, "
        f"val {[round(value, 2) for value in history['val_accuracy']]}, test {metrics['test_accuracy']:.3f}"
    )
    if preset:  # SGD's 0.1 is for batch 128; at 32 unscaled it stayed at chance with the loss rising
        assert "Peak lr 0.025 = 0.1 x batch 32 / 128 (linear scaling)" in caplog.text
    assert metrics["test_accuracy"] >= bound, metrics  # a preset that does not learn stays near chance (0.1)
    assert history["accuracy"][-1] > history["accuracy"][0] + 0.2, "training accuracy must climb"


OPTION_EPOCHS = 12  # one budget for every option: CutMix and RandAugment learn slower than the defaults (0.67
# and 0.79 after 8 epochs, still climbing)
OPTIONS = {  # each state-of-the-art option of docs/training.md, alone, on top of the defaults
    "randaugment": ["dataset.augment.policy=randaugment"],
    "augmix": ["dataset.augment.policy=augmix"],
    "random_erasing": ["dataset.augment.random_erasing=0.25"],
    "mixup": ["dataset.augment.mixup_alpha=0.2"],
    "cutmix": ["dataset.augment.cutmix_alpha=1.0"],
    "ema": ["optimizer.ema_momentum=0.9"],
    "grad_accum": ["trainer.grad_accum_steps=2"],
    "flip_tta": ["evaluate.tta=flip"],
}


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_training_option_still_learns_synthetic_cifar_in_the_same_budget(tmp_path, option):
    data = write_stripes(tmp_path / "cifar", records_per_file=128, num_test=200)
    overrides = [*stripes_overrides(data, OPTION_EPOCHS), *OPTIONS[option]]
    run_task(compose(overrides, tmp_path / "run"))
    metrics = check_run_metrics(tmp_path / "run")
    print(f"{option}: test {metrics['test_accuracy']:.3f}")  # for `pytest -m slow -rP`
    assert metrics["test_accuracy"] >= 0.8, metrics
