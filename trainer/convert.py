"""Image folders to sharded TFRecords: `python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`.

    python -m trainer.convert PetImages/ records/ --format jpeg --val-fraction 0.1 --test-fraction 0.1

INPUT_DIR holds one subfolder per class (Cat/, Dog/), or image files only (an
unlabeled test set whose file names are kept in the records). Examples are
split per class, shuffled with the seed and written in order, so every shard
mixes classes and the bytes are the same whatever `--workers` is. Unreadable
files (corrupt, empty, Thumbs.db, ...) are skipped and listed with the reason
in the log and in OUTPUT_DIR/manifest.json, which the reader (`dataset=cats_dogs`) uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tqdm import tqdm

from trainer import quiet
from trainer.data.images import RESIZE_MODES, encode_chunk, encode_file, list_images, read_chunk
from trainer.errors import UserError

log = logging.getLogger("trainer.convert")
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
CHUNK = 32  # images per task sent to a worker


@dataclass(frozen=True)
class ConvertOptions:
    image_size: int = 224
    format: str = "raw"  # raw | jpeg
    resize: str = "resize"  # resize | crop | pad
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    records_per_shard: int = 1000
    workers: int = 0  # 0: one per core
    seed: int = 0
    jpeg_quality: int = 95
    classes: tuple[str, ...] = ()  # default: the sorted subfolder names


def scan(input_dir: Path, classes: tuple[str, ...]) -> tuple[list[str] | None, list[tuple[Path, int | None]]]:
    """(class names, [(file, label)]): labeled when INPUT_DIR has subfolders, else (None, unlabeled files).

    Raises:
        UserError: the folder is missing, or a requested class has no folder.
    """
    if not input_dir.is_dir():
        raise UserError(f"INPUT_DIR {input_dir}: no such folder")
    folders = sorted(path.name for path in input_dir.iterdir() if path.is_dir() and not path.name.startswith("."))
    if not folders:
        return None, [(path, None) for path in list_images(input_dir)]
    names = list(classes) or folders
    missing = [name for name in names if not (input_dir / name).is_dir()]
    if missing:
        raise UserError(f"--classes {','.join(missing)}: no such subfolder of {input_dir} (found {folders})")
    return names, [(path, label) for label, name in enumerate(names) for path in list_images(input_dir / name)]


def assign_splits(items: list, labeled: bool, options: ConvertOptions) -> dict[str, list]:
    """Splits per class (so each split keeps the class balance), then shuffles each split with the seed."""
    if not labeled:
        return {"test": items}
    rng = random.Random(options.seed)
    splits = {name: [] for name in SPLITS}
    for label in sorted({label for _, label in items}):
        members = [item for item in items if item[1] == label]
        rng.shuffle(members)
        num_val = round(len(members) * options.val_fraction)
        num_test = round(len(members) * options.test_fraction)
        splits["val"] += members[:num_val]
        splits["test"] += members[num_val : num_val + num_test]
        splits["train"] += members[num_val + num_test :]
    for members in splits.values():
        rng.shuffle(members)
    return {name: members for name, members in splits.items() if members}


def _shard_name(split: str, index: int) -> str:
    return f"{split}.tfrecords_{index:03d}"


def _write_split(split, items, encoded, spec, options, output_dir, input_dir, progress):
    """Writes one split's shards (each via a temporary name); returns (files, per-class counts, skipped)."""
    tf = quiet.import_tensorflow()

    from trainer.data.tfrecords import make_example

    files, counts, skipped = [], Counter(), []
    writer, in_shard, temporary = None, 0, None

    def close():
        if writer is not None:
            writer.close()
            os.replace(temporary, output_dir / files[-1])

    for (path, label), (data, error) in zip(items, encoded, strict=True):
        progress.update()
        relative = str(path.relative_to(input_dir))
        if error is not None:
            skipped.append({"file": relative, "reason": error})
            log.warning("Skipped %s: %s", relative, error)
            continue
        if writer is None or in_shard == options.records_per_shard:
            close()
            files.append(_shard_name(split, len(files)))
            temporary = output_dir / f".{files[-1]}.tmp"
            writer, in_shard = tf.io.TFRecordWriter(str(temporary)), 0
        filename = relative if label is None else None
        if options.format == "jpeg":
            filename = relative
        writer.write(make_example(spec, data, label, filename, options.image_size, options.image_size))
        in_shard += 1
        counts[label] += 1
    close()
    return files, counts, skipped


def convert(input_dir: Path, output_dir: Path, options: ConvertOptions) -> dict:
    """Converts a folder and writes the shards and manifest.json; returns the manifest.

    Raises:
        UserError: bad input or output folder, or no readable image at all.
    """
    class_names, items = scan(input_dir, options.classes)
    if not items:
        raise UserError(f"INPUT_DIR {input_dir}: holds no files")
    if (output_dir / MANIFEST).exists():
        raise UserError(f"OUTPUT_DIR {output_dir} already holds a converted dataset; choose another folder")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"OUTPUT_DIR {output_dir}: cannot create it ({error.strerror})") from None
    splits = assign_splits(items, class_names is not None, options)
    workers = options.workers or os.cpu_count() or 1
    log.info(
        "Converting %d files from %s with %d worker(s): %s",
        len(items),
        input_dir,
        workers,
        {name: len(members) for name, members in splits.items()},
    )
    settings = dict(size=options.image_size, mode=options.resize, format=options.format, quality=options.jpeg_quality)
    ordered = [item for members in splits.values() for item in members]
    manifest = {
        "format": options.format,
        "image_size": options.image_size,
        "resize": options.resize,
        "class_names": class_names,
        "labeled": class_names is not None,
        "seed": options.seed,
        "splits": {},
        "skipped": [],
    }
    # Workers only decode and resize (Pillow); this process writes every record in a fixed order.
    context = multiprocessing.get_context("spawn")
    paths = [str(path) for path, _ in ordered]
    with (
        context.Pool(workers) if workers > 1 else contextlib.nullcontext() as pool,
        tqdm(total=len(ordered), unit="img", desc="convert", disable=None) as progress,
    ):
        if pool is None:
            results = (encode_file(path, **settings) for path in paths)
        else:  # image bytes come back through shared memory: cheaper than the pool's pipe
            chunks = [paths[start : start + CHUNK] for start in range(0, len(paths), CHUNK)]
            results = (
                pair for chunk in pool.imap(partial(encode_chunk, **settings), chunks) for pair in read_chunk(*chunk)
            )
        # Imported only now, so the workers decode while TensorFlow loads (seconds) in this process.
        quiet.import_tensorflow()
        from trainer.data.tfrecords import RecordSpec

        spec = RecordSpec.for_format(options.format, options.image_size)
        manifest["feature_keys"] = {"image": spec.image_key, "label": spec.label_key, "filename": spec.filename_key}
        for split, members in splits.items():
            encoded = (next(results) for _ in members)
            files, counts, skipped = _write_split(
                split, members, encoded, spec, options, output_dir, input_dir, progress
            )
            per_class = {
                (class_names[label] if class_names else "unlabeled"): count
                for label, count in sorted(counts.items(), key=lambda pair: (pair[0] is None, pair[0]))
            }
            manifest["splits"][split] = {"files": files, "count": sum(counts.values()), "per_class": per_class}
            manifest["skipped"] += skipped
    if not any(split["count"] for split in manifest["splits"].values()):
        raise UserError(f"INPUT_DIR {input_dir}: no readable image among {len(items)} files")
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log.info(
        "Wrote %s; skipped %d file(s)",
        {name: split["count"] for name, split in manifest["splits"].items()},
        len(manifest["skipped"]),
    )
    return manifest


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1); got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {text}")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` only where X says something: not for an empty default or a flag."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.convert",
        description=__doc__.split("\n\n")[0],
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("input_dir", type=Path, help="folder with one subfolder per class, or unlabeled images")
    parser.add_argument("output_dir", type=Path, help="where the shards and manifest.json go (new or empty)")
    parser.add_argument("--image-size", type=_positive, default=224, help="side of the stored square images")
    parser.add_argument(
        "--format",
        choices=("raw", "jpeg"),
        default="raw",
        help="raw: classic label + img_raw pixels; jpeg: TFDS/Model Garden keys, several times smaller",
    )
    parser.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default="resize",
        help="resize: plain; crop: centre crop to a square first; pad: pad to a square first",
    )
    parser.add_argument("--val-fraction", type=_fraction, default=0.0, help="share of each class for val")
    parser.add_argument("--test-fraction", type=_fraction, default=0.0, help="share of each class for test")
    parser.add_argument("--records-per-shard", type=_positive, default=1000, help="records in each shard file")
    parser.add_argument("--workers", type=int, default=0, help="decoding processes; 0 means one per core")
    parser.add_argument("--seed", type=int, default=0, help="seeds the split and the shuffle")
    parser.add_argument("--jpeg-quality", type=int, default=95, help="JPEG quality for --format jpeg")
    parser.add_argument(
        "--classes",
        default="",
        help="comma-separated class subfolders, in label order (default: all subfolders, sorted)",
    )
    parser.add_argument("--tf-logs", action="store_true", help="show TensorFlow's own start-up and INFO logs")
    args = parser.parse_args(argv)
    if args.val_fraction + args.test_fraction >= 1:
        parser.error("--val-fraction plus --test-fraction must be below 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    args = parse_args(argv)
    quiet.configure(args.tf_logs)
    options = ConvertOptions(
        image_size=args.image_size,
        format=args.format,
        resize=args.resize,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        records_per_shard=args.records_per_shard,
        workers=args.workers,
        seed=args.seed,
        jpeg_quality=args.jpeg_quality,
        classes=tuple(name for name in args.classes.split(",") if name),
    )
    try:
        convert(args.input_dir, args.output_dir, options)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
