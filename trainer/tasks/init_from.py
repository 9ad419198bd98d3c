"""`model.init_from=RUN`: a new run that starts from the weights of a run you like (its best.keras) or a .keras file.

    python run.py dataset=folder dataset.data_dir=photos/ dataset.val_fraction=0.2 experiment=photos_quick \
        model.init_from=outputs/2026-12-01/10-00-00 trainer.epochs=20
    python run.py ... model.init_from=RUN finetune.freeze_epochs=2    # other classes: the new head alone first

The new run has its own folder, config and schedule: only the weights come from RUN. Data
of other classes gets a new head (one line says so); `finetune.freeze_epochs` then trains
it alone on the frozen network first, as fine-tuning from ImageNet does. Another input
size or another network is one line naming both. A resumed run goes on from its own
backup, not from RUN again.
"""

from __future__ import annotations

import logging
from pathlib import Path

import keras
import tensorflow as tf

from trainer.errors import ConfigError
from trainer.models.preprocessing import Models
from trainer.models.transfer import NetworkMismatch, copy_weights, head_name
from trainer.runs import checkpoints

log = logging.getLogger(__name__)


def source_file(init_from: str) -> Path:
    """The `.keras` file `model.init_from` names: a run folder's checkpoints/best.keras, or the file itself;
    checked before any data is read.

    Raises:
        ConfigError: nothing is there, or the folder holds no best.keras.
    """
    path = Path(init_from).expanduser()
    if path.is_dir():
        if not (path / checkpoints.BEST).is_file():
            raise ConfigError(
                f"model.init_from={init_from}: the folder holds no {checkpoints.BEST} (a training run folder, "
                f"or a .keras file)"
            )
        return path / checkpoints.BEST
    if not path.is_file() or path.suffix != ".keras":
        raise ConfigError(f"model.init_from={init_from}: no such run folder or .keras file")
    return path


def _network(model: keras.Model) -> str:
    """How a log line names a network: `vgg19 (1,234,567 parameters)`."""
    return f"{model.name} ({model.count_params():,} parameters)"


def start_from(init_from: str, models: Models, class_names: list[str], strategy: tf.distribute.Strategy) -> dict:
    """Sets `models` (built for this run) to the weights `init_from` holds, with a new head for other classes.

    Returns:
        What metrics.json records: {"file", "epoch" (of the source's weights), "new_head"}.

    Raises:
        ConfigError: the source takes another input size, or is another network (a layer missing or of
            other shapes), each one line naming both.
    """
    file = source_file(init_from)
    source, info = checkpoints.load(file)
    size = models.inference.input_shape[1]
    if info.image_size != size:
        raise ConfigError(
            f"model.init_from={init_from}: its model takes {info.image_size}x{info.image_size} images, this run's "
            f"{size}x{size}: set dataset.image_size (and any crop) so that the model sees {info.image_size} pixels"
        )
    new_head = tuple(info.class_names) != tuple(class_names)
    try:
        with strategy.scope():
            copied = copy_weights(source, models.inference, new_head)
    except NetworkMismatch as error:
        raise ConfigError(
            f"model.init_from={init_from}: its network {_network(source)} is not this run's "
            f"{_network(models.inference)}: {error}; give the model keys it was trained with (its .hydra/config.yaml)"
        ) from None
    epoch = f"epoch {info.epoch}" if info.epoch else "its weights"
    if new_head:
        log.info(
            "Starting from %s (%s): its classes %s are not this data's %s: the head (%s) is new, the other %d "
            "layers start from its weights <model.init_from=%s>",
            file, epoch, _listed(info.class_names), _listed(class_names), head_name(models.inference), copied,
            init_from,
        )  # fmt: skip
    else:
        log.info("Starting from %s (%s): all %d layers <model.init_from=%s>", file, epoch, copied, init_from)
    return {"file": str(file), "epoch": info.epoch, "new_head": new_head}


def _listed(names) -> str:
    """[a, b, c], or the first five and a count."""
    names = list(names)
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} classes)" if len(names) > 5 else "")
    return f"[{shown}]"
