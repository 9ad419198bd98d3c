"""Image folders to sharded TFRecords: `python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`.

    python -m trainer.convert PetImages/ records/ --format jpeg --val-fraction 0.1 --test-fraction 0.1

The command line; `trainer.data.folder_to_records` converts. The arguments are read before TensorFlow is
imported (quietly, unless `--tf-logs` asks for its start-up lines): `--help` and a bad argument answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from trainer import quiet
from trainer.data.formats.base import ResizeMode
from trainer.data.record_writer import COMPRESSIONS
from trainer.errors import UserError, one_line


def _number(kind: Callable[[str], float], low: float, high: float | None, text: str) -> float:
    """`text` as a `kind` in [low, high) (no upper end when `high` is None), or argparse's one-line refusal."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value >= high):
        where = f">= {low}" if high is None else f"from {low} to {high - 1}" if kind is int else f"in [{low}, {high})"
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'} {where}; got {text}")
    return value


def _ranged(kind: Callable[[str], float], low: float, high: float | None = None) -> Callable[[str], float]:
    parse = lambda text: _number(kind, low, high, text)  # noqa: E731
    parse.__name__ = kind.__name__  # argparse names the type in some refusals
    return parse


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends `(default: X)` only where X says something: not for an empty default or a flag."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; `--help` lists every option with its default."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.convert", description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter
    )
    positive, fraction = _ranged(int, 1), _ranged(float, 0, 1)
    parser.add_argument("input_dir", type=Path, help="folder with one subfolder per class, or unlabeled images")
    parser.add_argument("output_dir", type=Path, help="where the shards and manifest.json go (new or empty)")
    parser.add_argument("--image-size", type=positive, default=224, help="side of the stored square images")
    parser.add_argument(
        "--format",
        choices=("raw", "jpeg"),
        default="raw",
        help="raw: classic label + img_raw pixels; jpeg: TFDS/Model Garden keys, several times smaller",
    )
    parser.add_argument(
        "--resize",
        choices=[mode.value for mode in ResizeMode],
        default="resize",
        help="resize: plain; crop: centre crop to a square first; pad: pad to a square first",
    )
    parser.add_argument("--val-fraction", type=fraction, default=0.0, help="share of each class for val")
    parser.add_argument("--test-fraction", type=fraction, default=0.0, help="share of each class for test")
    parser.add_argument("--records-per-shard", type=positive, default=1000, help="records in each shard file")
    parser.add_argument(
        "--workers", type=_ranged(int, 0), default=0, help="images decoded at once (tf.data); 0 means one per core"
    )
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="none",
        help="compress each shard (dataset.compression=auto reads any of them)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the split and the shuffle")
    parser.add_argument(
        "--jpeg-quality", type=_ranged(int, 1, 101), default=95, help="JPEG quality (1-100) for --format jpeg"
    )
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
    """The command: 0 when the folder is converted, 1 with one line on stderr when the input is refused (2 for
    a bad argument, as argparse does)."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    args = parse_args(argv)
    quiet.configure(args.tf_logs)
    quiet.import_tensorflow()
    from trainer.data import folder_to_records  # TensorFlow's first import, after quiet's settings

    options = folder_to_records.ConvertOptions(
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
        compression=args.compression,
    )
    try:
        folder_to_records.convert(args.input_dir, args.output_dir, options)
    except UserError as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
