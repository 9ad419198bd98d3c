"""Task functions: the only code that reads the Hydra config. `mode=` picks one.

python run.py mode=train
"""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.config import to_settings


def run_task(cfg: DictConfig) -> float | None:
    """Validates the composed config and runs the task named by `mode`."""
    settings = to_settings(cfg)
    from trainer.tasks.evaluate import evaluate, predict  # deferred: imports TensorFlow
    from trainer.tasks.train import train

    tasks = {"train": train, "evaluate": evaluate, "predict": predict}
    return tasks[settings.mode](settings)
