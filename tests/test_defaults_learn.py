"""The from-scratch presets learn in a few epochs on synthetic CIFAR-format data: `dataset=cifar` with the
defaults (VGG19 with batch norm at momentum 0.9, Adam) and `experiment=cifar_vgg19` (SGD at 0.1 for batch 128).

Each case trains a quarter-width VGG19 on 576 records for a few epochs (about a minute or two on 2 cores).
"""

from __future__ import annotations

import pytest

from conftest import check_run_metrics, compose, write_cifar
from trainer.resume import read_history
from trainer.tasks import run_task

EPOCHS = 8
# write_cifar's images are flat colour planes: R is 20 x label, G and B count the record index. Per-image
# standardization maps a flat (r, g, b) image to one angle, and the brightness jitter shifts the level by up to
# 63 (three classes' worth): both remove what these images carry (a nearest neighbour on standardized images
# finds 0.35 of the test labels). They suit photographs, not this data, so they stay off here.
KEEP_THE_LABEL = [
    "dataset.standardize=false",
    "dataset.augment.brightness=0",
    "dataset.augment.contrast_lower=1",
    "dataset.augment.contrast_upper=1",
]
CHANCE = 0.1


@pytest.mark.slow
@pytest.mark.parametrize("preset", [[], ["experiment=cifar_vgg19"]], ids=["defaults", "experiment=cifar_vgg19"])
def test_from_scratch_preset_learns_synthetic_cifar_in_a_few_epochs(tmp_path, preset, caplog):
    caplog.set_level("INFO", logger="trainer.tasks.train")
    data = write_cifar(tmp_path / "cifar", records_per_file=128, num_test=200)
    overrides = [
        "dataset=cifar",
        *preset,
        f"dataset.data_dir={data}",
        "dataset.val_size=64",
        *KEEP_THE_LABEL,
        "model.width_multiplier=0.25",
        f"trainer.epochs={EPOCHS}",
        "trainer.batch_size=32",  # 18 steps per epoch
        "trainer.threads=2",
        "trainer.verbose=0",
    ]
    run_task(compose(overrides, tmp_path / "run"))
    metrics = check_run_metrics(tmp_path / "run")
    history = read_history(tmp_path / "run" / "history.csv")
    print(  # the figures, for `pytest -m slow -rP`
        f"train accuracy {[round(value, 2) for value in history['accuracy']]}, "
        f"val {[round(value, 2) for value in history['val_accuracy']]}, test {metrics['test_accuracy']:.3f}"
    )
    if preset:  # SGD's 0.1 is for batch 128; at 32 unscaled it stayed at chance with the loss rising
        assert "Peak lr 0.025 = 0.1 x batch 32 / 128 (linear scaling)" in caplog.text
    assert metrics["test_accuracy"] >= 0.5, metrics  # 5x chance; a preset that does not learn stays near 0.1
    assert metrics["test_accuracy"] > 4 * CHANCE
