"""Task functions: the only code that reads the Hydra config. `mode=` picks one.

python run.py mode=train
"""

from __future__ import annotations

import io
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainer.config import to_settings


def print_config_tree(cfg: DictConfig, path: Path | None = None) -> str:
    """Prints the composed config as a tree (one branch per group) and saves it as text."""
    from rich.console import Console
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    for key, value in cfg.items():
        branch = tree.add(f"[bold]{key}[/bold]")
        text = OmegaConf.to_yaml(value, resolve=True) if OmegaConf.is_config(value) else str(value)
        branch.add(text.rstrip())
    Console().print(tree)
    recorder = Console(record=True, width=120, file=io.StringIO())
    recorder.print(tree)
    text = recorder.export_text()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def run_task(cfg: DictConfig, show_config: bool = False, overrides: list[str] | None = None) -> float | None:
    """Validates the composed config and runs the task named by `mode`.

    A resumed training takes its run's saved config; `overrides` (default: Hydra's command line)
    are checked against it.
    """
    if cfg.get("resume") and cfg.get("mode") == "train":
        cfg = _bind_resume(cfg, overrides)
    settings = to_settings(cfg)
    if show_config:
        print_config_tree(cfg, Path(settings.output_dir) / "config_tree.txt")
    from trainer.tasks.evaluate import evaluate, predict  # deferred: imports TensorFlow
    from trainer.tasks.export import export
    from trainer.tasks.inspect import inspect
    from trainer.tasks.train import train

    tasks = {"train": train, "evaluate": evaluate, "predict": predict, "inspect": inspect, "export": export}
    return tasks[settings.mode](settings)


def _bind_resume(cfg: DictConfig, overrides: list[str] | None) -> DictConfig:
    from hydra.core.hydra_config import HydraConfig

    from trainer.resume import bind_to_run, resolve_resume

    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return bind_to_run(cfg, Path(resolve_resume(cfg.resume, cfg.output_dir)), overrides)
