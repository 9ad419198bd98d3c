"""Save, find and load trained models: a `.keras` file that carries its class names and input spec.

A checkpoint is a self-contained `.keras` file: the model takes uint8 pixels and
owns its preprocessing (`trainer.models.preprocessing`), and the archive holds one
more entry, `vggtrain.json`, with the class names and the evaluation resize. Keras
ignores that entry, so `keras.saving.load_model(path)` still loads the model
anywhere, in safe mode, without this project's code.

    python run.py mode=evaluate checkpoint=outputs/2026-11-30/12-00-00        # a run folder: its best.keras
    python run.py mode=predict checkpoint=model.keras predict.input=photos/    # a bare file is enough
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import keras
import numpy as np

from trainer.errors import DataError
from trainer.runs import locks

log = logging.getLogger(__name__)

BEST = Path("checkpoints") / "best.keras"
INFO_ENTRY = "vggtrain.json"  # the extra entry in the .keras archive
FORMAT_VERSION = 1


# Upper bounds of vggtrain.json's numbers, checked at load: a crafted `resize_to: 100000` made export allocate
# [256, 100000, 100000, 3] and predict take more than 6 GB.
RESIZE_TO_FACTOR = 4  # resize_to is at most this many times image_size (training crops a little off the resize)
MAX_SIDE = 8192  # and at most this many pixels
MAX_EPOCH = 1_000_000


@dataclass(frozen=True)
class ModelInfo:
    """What a model needs besides its weights to be used again."""

    class_names: tuple[str, ...]  # index i of the output is class_names[i]
    image_size: int  # side of the square uint8 input
    resize_to: int  # evaluation: stored images are resized to this side, then centre-cropped to image_size
    normalization: str  # inside the model: standardize | caffe | none (for display; the layers do the work)
    dataset: str = ""  # the dataset it was trained on
    epoch: int = 0  # the training epoch whose weights it holds (0: not recorded)
    resize_mode: str = "resize"  # how an encoded image is made square before the resize: resize | crop | pad
    decode: str = ""  # `trainer.data.decode.DECODE` of the run that trained it ("": saved before one decode)
    precision: str = ""  # the policy it was trained in (float32, mixed_bfloat16, ...); it is saved in float32
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, text: str) -> ModelInfo:
        values = json.loads(text)
        values["class_names"] = tuple(values["class_names"])
        return cls(**{key: values[key] for key in cls.__dataclass_fields__ if key in values})

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "class_names": list(self.class_names)}, indent=2)


def _deployable(model: keras.Model) -> keras.Model:
    """`model` as users deploy it: the same layers and weights without the optimizer and compile settings a
    compiled model would save too (Adam's two slots per weight made best.keras 3x the model; the run's
    backup keeps what a resume needs)."""
    if getattr(model, "optimizer", None) is None:
        return model
    return keras.Model(model.input, model.output, name=model.name)


MIXED = ("mixed_float16", "mixed_bfloat16")  # Keras's mixed policies: float32 variables, half-precision compute


def _layers(model: keras.Layer) -> Iterator[keras.Layer]:
    """`model` and every layer in it, those of nested models included."""
    yield model
    for layer in getattr(model, "layers", []):
        yield from _layers(layer)


def mixed_policy(model: keras.Model) -> str | None:
    """The mixed-precision policy some layer of `model` computes in (`mixed_bfloat16`), or None: all float32."""
    return next((layer.dtype_policy.name for layer in _layers(model) if layer.dtype_policy.name in MIXED), None)


def set_float32(model: keras.Model) -> list[tuple[keras.Layer, keras.DTypePolicy]]:
    """Sets every mixed policy in `model` to float32; returns each layer changed with its policy before."""
    changed = [(layer, layer.dtype_policy) for layer in _layers(model) if layer.dtype_policy.name in MIXED]
    for layer, _ in changed:
        layer.dtype_policy = "float32"
    return changed


@contextlib.contextmanager
def float32_policies(model: keras.Model) -> Iterator[keras.Model]:
    """`model` with every layer's mixed policy set to float32 for the body, and set back after it. Mixed policies
    keep their variables in float32, so the weights stay as they are; what changes is the compute dtype that a
    saved config names. Every runtime takes a float32 model as it is (ONNX Runtime refuses a bfloat16 Conv,
    LiteRT runs one only through Flex ops), and its predictions are the ones a check compares with."""
    changed = set_float32(model)
    try:
        yield model
    finally:
        for layer, policy in changed:
            layer.dtype_policy = policy


def save(model: keras.Model, path: str | os.PathLike, info: ModelInfo) -> None:
    """Saves the whole model to `path` (a `.keras` file) with `info` inside the archive, as a float32 model
    whatever policy it trains in (`float32_policies`); the run's backup keeps the training policy's state."""
    with float32_policies(model):
        _deployable(model).save(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(INFO_ENTRY, info.to_json())


def resolve(path: str | os.PathLike) -> Path:
    """The `.keras` file that `path` names.

    Raises:
        DataError: nothing is there, or the run folder holds no checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        best = path / BEST
        if not best.is_file():
            raise DataError(f"checkpoint={path}: {_why_no_checkpoint(path)}")
        return best
    if not path.is_file():
        raise DataError(f"checkpoint={path}: no such file or run folder")
    if path.suffix != ".keras":
        raise DataError(f"checkpoint={path}: expected a .keras file or a run folder")
    return path


def _why_no_checkpoint(folder: Path) -> str:
    """Why run folder `folder` holds no best checkpoint, as its invocations.jsonl tells: the last command that
    ran it, passing over resumes refused before they changed anything (their error starts `resume=`), which the
    reason then names."""
    entries = locks.invocations(folder)
    refused = [entry for entry in entries if str(entry.get("outcome") or "").startswith("error: resume=")]
    ran = [entry for entry in entries if not str(entry.get("outcome") or "").startswith("error: resume=")]
    if refused:  # a refused command's start line goes with its end line
        pids = {entry.get("pid") for entry in refused}
        ran = [entry for entry in ran if not (entry.get("event") == "start" and entry.get("pid") in pids)]
    if not ran:
        return f"the folder holds no {BEST} (is it a training run folder?)"
    last, again = ran[-1], f"; continue it with: python run.py resume={folder}"
    later = f" (the last resume was refused: {refused[-1]['outcome'].removeprefix('error: ')})" if refused else ""
    if locks.is_held(folder):  # training, or a resume starting up (it locks the folder before it reads data)
        return "the run has saved no checkpoint yet (it is training: its .lock is held)"
    if last.get("event") == "start":
        return "the run was killed before its first checkpoint" + again + later
    outcome = str(last.get("outcome") or "recorded no outcome")
    if outcome.startswith("error: "):  # e.g. a bad label the first step's check found: name it
        return f"the run stopped before its first checkpoint: {outcome.removeprefix('error: ')}" + later
    if outcome in ("preempted", "interrupted"):
        return f"the run was {outcome} before its first checkpoint" + again + later
    return f"the folder holds no {BEST} (the run's last command: {outcome})" + later


def _outdated(file: Path) -> DataError:
    return DataError(
        f"checkpoint={file} was saved by an older vggtrain (float inputs, no class names inside) or by another "
        f"tool: it cannot say how its inputs were prepared; train it again with this version"
    )


def read_info(file: Path) -> ModelInfo | None:
    """The `vggtrain.json` entry of a `.keras` archive, or None when it has none."""
    try:
        with zipfile.ZipFile(file) as archive:
            if INFO_ENTRY not in archive.namelist():
                return None
            text = archive.read(INFO_ENTRY).decode(errors="replace")
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"checkpoint={file}: cannot be loaded as a Keras model ({error})") from None
    try:
        return ModelInfo.from_json(text)
    except KeyError as error:
        raise DataError(f"checkpoint={file}: {INFO_ENTRY} has no field {error}") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise DataError(f"checkpoint={file}: {INFO_ENTRY} is not valid ({error})") from None


def info_of(path: str | os.PathLike) -> ModelInfo:
    """The `ModelInfo` of the checkpoint `path` names, read from its archive without building the model: the
    check a task makes before it reads any data.

    Raises:
        DataError: the file or folder is missing, holds no checkpoint, or the archive is unreadable or was saved
            before models carried their preprocessing.
    """
    file = resolve(path)
    info = read_info(file)
    if info is None:
        raise _outdated(file)
    return info


def _load_keras(file: Path) -> keras.Model:
    try:
        return keras.saving.load_model(file, compile=False, safe_mode=True)
    except Exception as error:  # a truncated zip, an unknown layer, a foreign file
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"checkpoint={file}: cannot be loaded as a Keras model ({reason})") from None


# Remove in vggtrain 0.2, with trainer/config/legacy.py: only 0.1 saved these layers (docs/development.md ledger)
def _without_augmentation(model: keras.Model, file: Path) -> keras.Model:
    """`model` without the random flip, brightness and contrast layers that checkpoints of vggtrain 0.x held
    between the cast and the normalization (uint8 -> to_float -> random_* -> normalization -> network); they
    acted in training only, so the weights and the evaluation are unchanged. Returns `model` when it has none."""
    kept = [layer for layer in model.layers[1:] if not layer.name.startswith("random_")]
    if len(kept) == len(model.layers) - 1:
        return model
    image = keras.Input(shape=model.input_shape[1:], dtype="uint8", name="image")
    x = image
    for layer in kept:
        x = layer(x)
    log.info("%s holds training-only augmentation layers (an earlier vggtrain); loaded without them", file)
    return keras.Model(image, x, name=model.name)


def _check_info(file: Path, info: ModelInfo, model: keras.Model) -> None:
    """The stored `vggtrain.json` against the model it describes: one line naming the checkpoint and the field."""

    def bad(field: str, value, expected: str) -> DataError:
        return DataError(f"checkpoint={file}: {INFO_ENTRY} has {field}={value!r}; expected {expected}")

    names = info.class_names
    if not names or not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
        raise bad("class_names", list(names), "distinct non-empty class names")
    if model.output_shape[-1] != len(names):
        raise DataError(f"checkpoint={file}: predicts {model.output_shape[-1]} classes but names {len(names)}")
    height, width = model.input_shape[1:3]
    if info.image_size != height or height != width:
        raise bad("image_size", info.image_size, f"{height}, the side of the model's input {model.input_shape[1:]}")
    most = min(RESIZE_TO_FACTOR * info.image_size, MAX_SIDE)
    if type(info.resize_to) is not int or not info.image_size <= info.resize_to <= most:
        raise bad("resize_to", info.resize_to, f"a whole number from image_size {info.image_size} to {most}")
    if type(info.epoch) is not int or not 0 <= info.epoch <= MAX_EPOCH:
        raise bad("epoch", info.epoch, f"a whole number from 0 to {MAX_EPOCH}")
    if type(info.format_version) is not int or not 1 <= info.format_version <= FORMAT_VERSION:
        raise bad("format_version", info.format_version, f"1 to {FORMAT_VERSION} (a newer vggtrain saved it?)")
    # runs/ imports nothing above it (tests/test_layout.py): the choices of data.decode and models.preprocessing
    if info.resize_mode not in ("resize", "crop", "pad"):
        raise bad("resize_mode", info.resize_mode, "resize, crop or pad")
    if info.normalization not in ("standardize", "caffe", "none"):
        raise bad("normalization", info.normalization, "standardize, caffe or none")


def load(path: str | os.PathLike) -> tuple[keras.Model, ModelInfo]:
    """Loads a checkpoint (safe mode) with its `ModelInfo`: the inference model (a checkpoint of an earlier
    version loses its training-only augmentation layers, with one log line).

    Args:
        path: A `.keras` file or a run folder.

    Raises:
        DataError: the file is missing or unreadable, or was saved before models carried their preprocessing.
    """
    file = resolve(path)
    info = read_info(file)
    model = _load_keras(file)
    if info is None or model.input.dtype != "uint8":
        raise _outdated(file)
    model = _without_augmentation(model, file)
    mixed = mixed_policy(model)
    if mixed is not None:  # saved so by vggtrain before it saved float32 models: the same weights in float32
        log.info("%s computes in %s (an earlier vggtrain saved it so): loaded as a float32 model", file, mixed)
        set_float32(model)
    _check_info(file, info, model)
    return model, info


PENDING_BEST = "best.pending-epoch"  # + 5 digits + .keras: a new best, until the backup commits its epoch


def pending_best(folder: Path, epoch: int) -> Path:
    """Where the checkpoint of a new best at `epoch` waits for its epoch's commit (`commit_best`)."""
    return folder / f"{PENDING_BEST}{epoch:05d}.keras"


def commit_best(folder: Path, done: int) -> None:
    """Makes the newest pending best of a committed epoch (<= `done`) the folder's best.keras, and deletes those of
    later epochs: best.keras never holds an epoch that history.csv does not (a kill between a new best and the
    backup's commit, then a resume, would otherwise report test figures of weights no epoch row has)."""
    newest = None
    for path in sorted(folder.glob(f"{PENDING_BEST}*.keras")):
        epoch = int(path.name.removeprefix(PENDING_BEST).removesuffix(".keras") or 0)
        if epoch > done:
            path.unlink(missing_ok=True)
            continue
        if newest is not None:
            newest.unlink(missing_ok=True)
        newest = path
    if newest is not None:
        os.replace(newest, folder / "best.keras")


def check_data(file: str | os.PathLike, info: ModelInfo, class_names: list[str], image_size: int, source: str) -> None:
    """Checks that data prepared by `source` fits the model: same classes in the same order (in any letter case:
    the converter names them after folders such as `Cat/`, the config `cat`), same input size.

    Raises:
        DataError: one line naming both class lists, or both sizes.
    """
    if [name.casefold() for name in info.class_names] != [name.casefold() for name in class_names]:
        raise DataError(
            f"checkpoint={file} was trained on classes {list(info.class_names)} but {source} has {list(class_names)}"
        )
    if image_size != info.image_size:
        raise DataError(
            f"checkpoint={file} takes {info.image_size}x{info.image_size} images but {source} gives "
            f"{image_size}x{image_size} (dataset.image_size / dataset.augment.crop_size)"
        )


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes: equal exactly when two models hold identical weights."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()
