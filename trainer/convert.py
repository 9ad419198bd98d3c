"""`python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`: the converter's command line
(`trainer.data.folder_to_records` converts).

    python -m trainer.convert PetImages/ records/ --format jpeg --val-fraction 0.1 --test-fraction 0.1

TensorFlow (the one decode) is imported quietly first, unless `--tf-logs` asks for its start-up lines.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from trainer import quiet

if __name__ == "__main__":  # before TensorFlow's first import, which the imports below make
    quiet.configure("--tf-logs" in sys.argv[1:])
    quiet.import_tensorflow()

from trainer.data import decode, folder_to_records, record_writer  # noqa: E402
from trainer.errors import UserError  # noqa: E402


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
    """The command line; `--help` lists every option with its default."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.convert",
        description=folder_to_records.__doc__.split("\n\n")[0],
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
        choices=decode.RESIZE_MODES,
        default="resize",
        help="resize: plain; crop: centre crop to a square first; pad: pad to a square first",
    )
    parser.add_argument("--val-fraction", type=_fraction, default=0.0, help="share of each class for val")
    parser.add_argument("--test-fraction", type=_fraction, default=0.0, help="share of each class for test")
    parser.add_argument("--records-per-shard", type=_positive, default=1000, help="records in each shard file")
    parser.add_argument("--workers", type=int, default=0, help="images decoded at once (tf.data); 0 means one per core")
    parser.add_argument(
        "--compression",
        choices=record_writer.COMPRESSIONS,
        default="none",
        help="compress each shard (dataset.compression=auto reads any of them)",
    )
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
    """The command: 0 when the folder is converted, 1 with one line on stderr when the input is refused."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    args = parse_args(argv)
    quiet.configure(args.tf_logs)
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
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
