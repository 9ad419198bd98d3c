"""Image folders to sharded TFRecords: `python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`.

    python -m trainer.convert PetImages/ records/ --format jpeg --val-fraction 0.1 --test-fraction 0.1

INPUT_DIR holds one subfolder per class (Cat/, Dog/), or image files only (an
unlabeled test set whose file names are kept in the records). Examples are
split per class and shuffled with the seed; each shard's examples are fixed before
any is decoded, and the images are decoded by the one decode that training, prediction
and serving use (`trainer.data.decode`), `--workers` at once in an order-keeping
`tf.data` map, so the bytes are the same whatever `--workers` is. Unreadable files (corrupt, empty,
Thumbs.db, decompression bombs, ...), stray top-level files, broken symlinks and
FIFOs are skipped and listed with the reason in the log and in OUTPUT_DIR/manifest.json,
which the reader (`dataset=cats_dogs`) uses.

A rerun over a killed conversion is safe: shards are written into OUTPUT_DIR/.staging
and moved into place, manifest.json last; an OUTPUT_DIR without manifest.json that holds
only the converter's own files is cleared first, and one holding anything else is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from trainer.data import pipeline, record_writer, tfrecords
from trainer.data.check import check_splits
from trainer.data.decode import DECODE, MAX_PIXELS
from trainer.data.decoders import TFRecordDecoder
from trainer.data.folder import stratified_split, walk_files
from trainer.data.images import Decoded, decode_files, special_file_reason
from trainer.data.parts import two_classes
from trainer.data.preprocess import Preprocess
from trainer.data.shares import Records
from trainer.data.sources import Source, TFRecordReader
from trainer.errors import UserError

log = logging.getLogger("trainer.convert")
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
STAGING = ".staging"  # shards being written; moved into OUTPUT_DIR when every one is done
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
OWN_FILE = re.compile(r"(train|val|test)\.tfrecords_\d{3,}|manifest\.json|data_check\.json|\..*\.tmp|\.staging")


@dataclass(frozen=True)
class ConvertOptions:
    image_size: int = 224
    format: str = "raw"  # raw | jpeg
    resize: str = "resize"  # resize | crop | pad
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    records_per_shard: int = 1000
    workers: int = 0  # images decoded at once; 0: one per core
    seed: int = 0
    jpeg_quality: int = 95
    classes: tuple[str, ...] = ()  # default: the sorted subfolder names
    compression: str = "none"  # none | gzip | zlib


def display_name(path: Path, root: Path) -> str:
    """A relative path as text for logs and the manifest; bytes that are not UTF-8, and control characters (a
    newline in a name would forge a log line), become backslash escapes."""
    text = os.fsencode(path.relative_to(root)).decode("utf-8", errors="backslashreplace")
    return CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


def _walk(folder: Path, root: Path, skipped: list[dict]) -> list[Path]:
    """Regular files below `folder` (through symlinked folders, as `dataset=folder` lists them), sorted; everything
    else goes to `skipped` with its reason."""
    files = []
    for path in walk_files(folder):
        reason = special_file_reason(path)
        if reason is None:
            files.append(path)
        else:
            skipped.append({"file": display_name(path, root), "reason": reason})
    return files


def scan(input_dir: Path, classes: tuple[str, ...]) -> tuple[list[str] | None, list[tuple[Path, int | None]], list]:
    """(class names, [(file, label)], skipped): labeled when INPUT_DIR has subfolders, else (None, unlabeled files).

    In a labeled input, files beside the class folders, broken symlinks and FIFOs are skipped (and listed).

    Raises:
        UserError: the folder is missing, holds one class, or a requested class is a path or has no folder.
    """
    if not input_dir.is_dir():
        raise UserError(f"INPUT_DIR {input_dir}: no such folder")
    skipped = []
    folders = sorted(path.name for path in input_dir.iterdir() if path.is_dir() and not path.name.startswith("."))
    if not folders:
        return None, [(path, None) for path in _walk(input_dir, input_dir, skipped)], skipped
    names = list(classes) or folders
    paths = [name for name in names if name in (".", "..") or "/" in name or os.sep in name]
    if paths:
        raise UserError(f"--classes {','.join(paths)}: a class is the name of a subfolder of {input_dir}, not a path")
    two_classes(
        names,
        lambda one: f"--classes {one}: one class" if classes else f"INPUT_DIR {input_dir}: one class folder ({one}/)",
    )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"--classes {','.join(classes)}: {', '.join(repeated)} given twice; name each class once")
    missing = [name for name in names if not (input_dir / name).is_dir()]
    if missing:
        raise UserError(f"--classes {','.join(missing)}: no such subfolder of {input_dir} (found {folders})")
    left_out = [name for name in folders if name not in names]
    if left_out:
        log.warning(
            "--classes %s leaves out the folders %s of %s: their images are not converted",
            ",".join(names),
            ", ".join(left_out),
            input_dir,
        )
    for path in sorted(input_dir.iterdir()):
        if not path.is_dir():
            reason = special_file_reason(path) or "a top-level file, not in a class folder"
            skipped.append({"file": display_name(path, input_dir), "reason": reason})
    items = [(path, label) for label, name in enumerate(names) for path in _walk(input_dir / name, input_dir, skipped)]
    return names, items, skipped


def assign_splits(items: list, labeled: bool, options: ConvertOptions) -> dict[str, list]:
    """Splits per class (so each split keeps the class balance), then shuffles each split with the seed: the
    split `dataset=folder` makes of the same folder with the same fractions and seed."""
    if not labeled:
        return {"test": items}
    splits = stratified_split(items, options.val_fraction, options.test_fraction, options.seed)
    return {name: members for name, members in splits.items() if members}


def _shard_name(split: str, index: int) -> str:
    return f"{split}.tfrecords_{index:03d}"


@dataclass(frozen=True)
class ShardTask:
    """One shard: its examples are fixed before any image is decoded."""

    path: str  # in the staging folder
    files: tuple[str, ...]
    labels: tuple[int | None, ...]
    names: tuple[bytes, ...]  # relative paths as bytes (kept exactly, UTF-8 or not)
    shown: tuple[str, ...]  # the same names as text, for the manifest


def _per_file(runs: Iterator[Decoded]) -> Iterator[tuple[str | None, np.ndarray | None]]:
    """`decode_files`' runs as one (reason it gives no image, or None; pixels) per file, in order."""
    for run in runs:
        pixels = iter(run.images if run.images is not None else [])
        for error in run.errors:
            yield (error, None) if error is not None else (None, next(pixels))


def write_shard(task: ShardTask, options: ConvertOptions, decoded: Iterator[tuple]) -> tuple[Counter, list[dict]]:
    """Writes the shard's records in order, taking its files' images from `decoded` (`_per_file`: one decode
    pipeline for every shard, so tf.data traces the decode once, not once per shard).

    Returns:
        (records per label, skipped files with their reasons).
    """
    keys = record_writer.DEFAULT_KEYS[options.format]
    counts, skipped = Counter(), []
    size = options.image_size
    with record_writer.RecordFile(task.path, options.compression) as shard:
        for index in range(len(task.files)):
            error, pixels = next(decoded)
            if error is not None:
                skipped.append({"file": task.shown[index], "reason": error})
                continue
            label, name = task.labels[index], task.names[index]
            features = record_writer.example_features(
                options.format, keys, _encoded(pixels, options), label, name, size, size
            )
            shard.write(record_writer.encode_example(features))
            counts[label] += 1
    return counts, skipped


def _encoded(pixels: np.ndarray, options: ConvertOptions) -> bytes:
    """The stored image: raw RGB bytes, or a JPEG (read back by the same decode as every other path)."""
    if options.format == "raw":
        return pixels.tobytes()
    return tf.io.encode_jpeg(pixels, quality=options.jpeg_quality).numpy()


def prepare_output(input_dir: Path, output_dir: Path) -> None:
    """Makes OUTPUT_DIR ready: new, empty, or left by a killed conversion (its own files are removed).

    Raises:
        UserError: OUTPUT_DIR is inside INPUT_DIR, holds a finished conversion, or holds other files.
    """
    if output_dir.resolve().is_relative_to(input_dir.resolve()):
        raise UserError(
            f"OUTPUT_DIR {output_dir} is inside INPUT_DIR {input_dir}: the next conversion would read it as a "
            f"class of its own; choose a folder outside it"
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"OUTPUT_DIR {output_dir}: exists and is not a folder")
    if (output_dir / MANIFEST).exists():
        raise UserError(f"OUTPUT_DIR {output_dir} already holds a converted dataset; choose another folder")
    if output_dir.is_dir():
        entries = sorted(output_dir.iterdir())
        foreign = [entry.name for entry in entries if not OWN_FILE.fullmatch(entry.name)]
        if foreign:
            raise UserError(
                f"OUTPUT_DIR {output_dir} holds files the converter did not write ({', '.join(foreign[:3])}"
                f"{' ...' if len(foreign) > 3 else ''}); choose a new or empty folder"
            )
        if entries:
            log.warning(
                "OUTPUT_DIR %s holds %d file(s) of an unfinished conversion: removing them", output_dir, len(entries)
            )
        for entry in entries:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    try:
        (output_dir / STAGING).mkdir(parents=True)
    except OSError as error:
        raise UserError(f"OUTPUT_DIR {output_dir}: cannot create it ({error.strerror})") from None


def _tasks(splits: dict[str, list], input_dir: Path, options: ConvertOptions, staging: Path) -> list[tuple]:
    """(split, ShardTask) for every shard: `records_per_shard` consecutive examples of a split each."""
    tasks = []
    for split, members in splits.items():
        size = options.records_per_shard
        for index, start in enumerate(range(0, len(members), size)):
            chunk = members[start : start + size]
            names = tuple(os.fsencode(path.relative_to(input_dir)) for path, _ in chunk)
            task = ShardTask(
                str(staging / f"{split}-{index:05d}"),
                tuple(str(path) for path, _ in chunk),
                tuple(label for _, label in chunk),
                names,
                tuple(display_name(path, input_dir) for path, _ in chunk),
            )
            tasks.append((split, task))
    return tasks


def convert(input_dir: Path, output_dir: Path, options: ConvertOptions) -> dict:
    """Converts a folder and writes the shards and manifest.json; returns the manifest.

    Raises:
        UserError: bad input or output folder, an image size over `MAX_PIXELS`, or no readable image at all.
    """
    if options.image_size**2 > MAX_PIXELS:
        raise UserError(
            f"--image-size {options.image_size}: {options.image_size}x{options.image_size} is over the "
            f"{MAX_PIXELS:,}-pixel limit of one image (a decompression bomb's)"
        )
    class_names, items, skipped = scan(input_dir, options.classes)
    for entry in skipped:
        log.warning("Skipped %s: %s", entry["file"], entry["reason"])
    if not items:
        raise UserError(f"INPUT_DIR {input_dir}: holds no files")
    prepare_output(input_dir, output_dir)
    staging = output_dir / STAGING
    splits = assign_splits(items, class_names is not None, options)
    tasks = _tasks(splits, input_dir, options, staging)
    workers = options.workers or os.cpu_count() or 1
    log.info(
        "Converting %d files from %s into %d shard(s), decoding %d at once: %s",
        len(items),
        input_dir,
        len(tasks),
        workers,
        {name: len(members) for name, members in splits.items()},
    )
    keys = record_writer.DEFAULT_KEYS[options.format]
    manifest = {
        "format": options.format,
        "image_size": options.image_size,
        "resize": options.resize,
        "decode": DECODE,  # how every image was decoded and resized (trainer.data.decode); readers check it
        "compression": options.compression,
        "class_names": class_names,
        "labeled": class_names is not None,
        "seed": options.seed,
        "feature_keys": keys,
        "splits": {},
        "skipped": skipped,
    }
    every_file = [path for _, task in tasks for path in task.files]
    decoded = _per_file(decode_files(every_file, options.image_size, options.resize, parallel=options.workers))
    with tqdm(total=len(items), unit="img", desc="convert", disable=None) as progress:
        outcomes = []
        for _, task in tasks:
            outcomes.append(write_shard(task, options, decoded))
            progress.update(len(task.files))
    written = {}  # per split, the files of its records in record order (the check names them)
    for split in splits:
        files, counts, file_counts, written[split] = [], Counter(), [], []
        for (task_split, task), (shard_counts, shard_skipped) in zip(tasks, outcomes, strict=True):
            if task_split != split:
                continue
            for entry in shard_skipped:
                log.warning("Skipped %s: %s", entry["file"], entry["reason"])
            manifest["skipped"] += shard_skipped
            if not shard_counts:  # every image of this shard was skipped
                os.remove(task.path)
                continue
            files.append(_shard_name(split, len(files)))
            os.replace(task.path, output_dir / files[-1])
            left_out = {entry["file"] for entry in shard_skipped}
            written[split] += [shown for shown in task.shown if shown not in left_out]
            counts += shard_counts
            file_counts.append(sum(shard_counts.values()))  # per-worker shares need them (trainer.data.shares)
        per_class = {
            (class_names[label] if class_names else "unlabeled"): count
            for label, count in sorted(counts.items(), key=lambda pair: (pair[0] is None, pair[0]))
        }
        manifest["splits"][split] = {"files": files, "count": sum(counts.values()), "per_class": per_class}
        manifest["splits"][split]["file_counts"] = file_counts
    staging.rmdir()
    if not any(split["count"] for split in manifest["splits"].values()):
        raise UserError(f"INPUT_DIR {input_dir}: no readable image among {len(items)} files")
    manifest["check"] = check_written(output_dir, manifest, written, options)
    temporary = output_dir / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, output_dir / MANIFEST)  # last: a folder with manifest.json is complete
    log.info(
        "Wrote %s; skipped %d file(s)",
        {name: split["count"] for name, split in manifest["splits"].items()},
        len(manifest["skipped"]),
    )
    return manifest


def check_written(output_dir: Path, manifest: dict, written: dict[str, list[str]], options: ConvertOptions) -> dict:
    """`mode=inspect inspect.check=true`'s check of what was written (`trainer.data.check`): every record read
    back and decoded, duplicates within a split and images in two splits named by their files. Writes
    OUTPUT_DIR/data_check.json and warns; returns the manifest's summary of it."""
    spec = tfrecords.RecordSpec.for_format(options.format, options.image_size)
    names = manifest["class_names"] or []
    reader = TFRecordReader(tfrecords.TF_COMPRESSION[options.compression])
    datasets = {}
    for split, entry in manifest["splits"].items():
        if entry["count"]:
            files = [str(output_dir / name) for name in entry["files"]]
            decoder = TFRecordDecoder(spec, len(names) or None, labeled=bool(names))
            source = Source(Records.whole_files(files, entry["count"]), reader)
            datasets[split] = pipeline.eval_dataset(source, decoder, Preprocess(options.image_size), 256)
    report = check_splits(datasets, names, lambda split, position: written[split][position])
    (output_dir / "data_check.json").write_text(json.dumps(report, indent=2) + "\n")
    duplicates, conflicts = sum(len(groups) for groups in report["duplicates"].values()), report["conflicts"]
    if duplicates or report["leakage"]:
        groups = [entry["examples"] for entry in conflicts + report["leakage"]] + sum(report["duplicates"].values(), [])
        log.warning(
            "The same image is written %d time(s) within a split and %d time(s) in two splits, %d of them under two "
            "labels (e.g. %s): see %s",
            duplicates,
            len(report["leakage"]),
            len(conflicts),
            " and ".join(groups[0][:2]),
            output_dir / "data_check.json",
        )
    summary = {"duplicates": duplicates, "leakage": len(report["leakage"]), "conflicts": len(conflicts)}
    return {**summary, "report": "data_check.json"}
