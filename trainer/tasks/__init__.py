"""Task functions: `mode=` picks one. With `trainer.config`, the only code that reads the Hydra config; every
function below them takes plain arguments.

    python run.py mode=train|evaluate|predict|inspect|export
"""

from __future__ import annotations

import importlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.config import reuse, to_settings
from trainer.errors import ConfigError
from trainer.runs.atomic import write_atomic

log = logging.getLogger(__name__)
# Modes that read a trained run: with checkpoint=RUN they start from the run's own config.
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
        pretrained = getattr(OmegaConf.get_type(cfg.get("model")), "PRETRAINED_BASE", False)
        if key == "finetune" and not (pretrained or cfg.get("model", {}).get("init_from")):
            continue  # only a pretrained base (model=vgg19_imagenet) or a run's weights train in phases
        branch = tree.add(f"[bold]{key}[/bold]")
        text = OmegaConf.to_yaml(value, resolve=True) if OmegaConf.is_config(value) else str(value)
        branch.add(text.rstrip())
    Console().print(tree)
    recorder = Console(record=True, width=120, file=io.StringIO())
    recorder.print(tree)
    text = recorder.export_text()
    if path is not None:
        write_atomic(path, lambda temporary: temporary.write_text(text))  # a full disk: one DiskError line
    return text


def with_run_config(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """For evaluate/predict/export/inspect of a run folder: the run's saved config, what was typed on top.
    For `resume=RUN`: the run's saved config, the command line checked against it (trainer.config.bind).

    Raises:
        ConfigError: one line for a value that does not resolve (`trainer.epochs=${oops}` was a traceback here).
    """
    try:
        return _with_run_config(cfg, overrides)
    except OmegaConfBaseException as error:
        where = f"{error.full_key}: " if getattr(error, "full_key", None) else ""
        raise ConfigError(where + str(error).splitlines()[0]) from None


def _with_run_config(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    if cfg.mode == "train" and cfg.get("resume"):
        from trainer.config.bind import bind_to_run
        from trainer.runs.resume import resolve_resume

        return bind_to_run(cfg, Path(resolve_resume(cfg.resume, cfg.output_dir)), overrides)
    run_dir = reuse.run_folder_of(cfg.checkpoint) if cfg.mode in reuse.REUSING_MODES else None
    if run_dir is None:
        return cfg
    merged, typed = reuse.reuse(cfg, run_dir, overrides)
    log.info(
        "Config of %s reused <checkpoint=%s>; overridden here: %s",
        run_dir / reuse.SAVED_CONFIG,
        cfg.checkpoint,
        ", ".join(typed) or "nothing",
    )
    return merged


def run_task(cfg: DictConfig, show_config: bool = False, overrides: Sequence[str] = ()) -> float | None:
    """Validates the composed config and runs the task named by `mode`.

    Args:
        cfg: The composed config.
        show_config: Print the config tree (and save it in the run folder).
        overrides: The command line's Hydra overrides; with `checkpoint=RUN` they apply on top of the run's
            saved config.
    """
    from trainer import quiet

    # Before anything imports TensorFlow (a resume's modules do): the command line's choice, then the run's.
    quiet.configure(bool(OmegaConf.select(cfg, "trainer.tf_logs", default=False)))
    quiet.import_tensorflow()
    cfg = with_run_config(cfg, overrides)
    settings = to_settings(cfg)
    # A resume may still be refused (its data, a bad label): the run folder's tree is written once it is taken.
    resumed = settings.mode == "train" and bool(settings.resume)
    tree = None
    if show_config:
        tree = print_config_tree(cfg, None if resumed else Path(settings.output_dir) / "config_tree.txt")
    quiet.configure(settings.trainer.tf_logs)
    task = importlib.import_module(f"trainer.tasks.{settings.mode}")  # each mode: its module and function
    if resumed:
        return task.train(settings, config_tree=tree)
    return getattr(task, str(settings.mode))(settings)
