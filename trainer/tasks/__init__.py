"""Task functions: the only code that reads the Hydra config. `mode=` picks one.

python run.py mode=train
"""

from __future__ import annotations

import io
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainer.config import to_settings

# The sections each mode reads; the others are left out of the printed tree (.hydra/config.yaml keeps them all).
MODE_SECTIONS = {
    "train": {"dataset", "model", "optimizer", "strategy", "trainer", "objective", "finetune"},
    "evaluate": {"dataset", "model", "strategy", "trainer", "evaluate"},
    "predict": {"dataset", "model", "strategy", "trainer", "predict"},
    "inspect": {"dataset", "model", "inspect"},
    "export": {"dataset", "model", "export"},
}


def print_config_tree(cfg: DictConfig, path: Path | None = None) -> str:
    """Prints the composed config as a tree (one branch per section the mode reads) and saves it as text."""
    from rich.console import Console
    from rich.tree import Tree

    sections = MODE_SECTIONS.get(str(cfg.get("mode")))
    tree = Tree(f"config <mode={cfg.get('mode')}>", guide_style="dim")
    for key, value in cfg.items():
        if sections is not None and OmegaConf.is_dict(value) and key not in sections:
            continue
        if value is None:  # checkpoint or resume, when not given
            continue
        if key == "finetune" and cfg.get("model", {}).get("name") != "vgg19_imagenet":
            continue  # only the ImageNet model trains in phases
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


def run_task(cfg: DictConfig, show_config: bool = False) -> float | None:
    """Validates the composed config and runs the task named by `mode`."""
    settings = to_settings(cfg)
    if show_config:
        print_config_tree(cfg, Path(settings.output_dir) / "config_tree.txt")
    from trainer import quiet

    quiet.configure(settings.trainer.tf_logs)
    quiet.import_tensorflow()  # before any other module imports it
    from trainer.tasks.evaluate import evaluate, predict  # deferred: imports TensorFlow
    from trainer.tasks.export import export
    from trainer.tasks.inspect import inspect
    from trainer.tasks.train import train

    tasks = {"train": train, "evaluate": evaluate, "predict": predict, "inspect": inspect, "export": export}
    return tasks[settings.mode](settings)
