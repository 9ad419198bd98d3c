"""Run folders of vggtrain 0.1 still load: their saved configs (tests/data/config_0.1_*.yaml, composed by 0.1
itself) read as today's, keeping what the old run did."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import compose
from trainer.config import reuse, to_settings
from trainer.tasks import with_run_config

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data"


def _run_folder(tmp_path: Path, name: str) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    shutil.copy(DATA / f"config_0.1_{name}.yaml", run_dir / ".hydra" / "config.yaml")
    return run_dir


def test_an_adam_run_of_0_1_loads_without_the_keys_adam_never_read(tmp_path):
    run_dir = _run_folder(tmp_path, "cifar_adam")
    typed = ["mode=evaluate", f"checkpoint={run_dir}"]
    settings = to_settings(with_run_config(compose(typed, tmp_path / "out"), typed))
    assert type(settings.optimizer).__name__ == "AdamConfig" and settings.optimizer._target_ == "keras.optimizers.Adam"
    assert "momentum" not in settings.optimizer.keras_options(), "0.1 ignored it for Adam; so does this version"
    assert settings.dataset.data_dir == "/data/cifar10" and settings.model.dropout == 0.2
    assert settings.logger.tensorboard is not None and settings.logger.mlflow is None


def test_an_sgd_finetuning_run_of_0_1_keeps_its_momentum_and_trackers(tmp_path):
    saved = reuse.load_saved(_run_folder(tmp_path, "pets_finetune_sgd"))
    assert saved.optimizer.momentum == 0.8 and saved.optimizer._target_ == "keras.optimizers.SGD"
    assert "weight_decay" not in saved.optimizer, "0.1's SGD never read weight_decay"
    assert saved.logger.mlflow is not None and saved.logger.wandb is not None and saved.logger.tensorboard is not None
    assert saved.callbacks.early_stopping._target_ == "keras.callbacks.EarlyStopping"
    assert saved.model.name == "vgg19_imagenet" and saved.strategy._target_ == "trainer.distribute.strategies.single"
