"""Benchmarks, each measured side by side in one process: `python -m benchmarks [--quick] [--only NAME ...]`.

Prints one table: a row per figure, this project's number, the baseline's, the
ratio and the target. Each case runs in a fresh process, so no case inherits
another's threads, caches or allocator state (the trainer rows read 0.96 after
the reader rows in one process, 1.00 alone). Data is generated into a temporary
folder; nothing is downloaded. Absolute numbers depend on the machine; the
ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from benchmarks import cases

MARKER = "BENCHMARK ROWS "
CASE = (
    "import dataclasses, json, pathlib, sys; from benchmarks.cases import CASES; "
    "rows = CASES[sys.argv[1]](pathlib.Path(sys.argv[2]), sys.argv[3] == '1'); "
    f"print({MARKER!r} + json.dumps([dataclasses.asdict(row) for row in rows]))"
)


def run_case(name: str, folder: str, quick: bool) -> list[cases.Row]:
    """The rows of one case, measured in a fresh Python process (its log lines pass through to stderr)."""
    command = [sys.executable, "-c", CASE, name, folder, str(int(quick))]
    output = subprocess.run(command, cwd=cases.ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    line = next(line for line in reversed(output.splitlines()) if line.startswith(MARKER))
    return [cases.Row(**row) for row in json.loads(line[len(MARKER) :])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer steps (a smoke run)")
    parser.add_argument("--only", nargs="*", choices=sorted(cases.CASES), help="run only these rows")
    args = parser.parse_args(argv)
    names = args.only or list(cases.CASES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vggtrain-bench-") as folder:
        for name in names:
            started = time.perf_counter()
            print(f"# {name} ...", file=sys.stderr, flush=True)
            rows += run_case(name, folder, args.quick)
            print(f"# {name} took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    header = ("figure", "ours", "baseline", "unit", "ratio", "target", "met")
    table = [header] + [
        (
            row.figure,
            f"{row.ours:,.1f}",
            f"{row.baseline:,.1f}",
            row.unit,
            f"{row.ratio:.2f}",
            row.target_text,
            {True: "yes", False: "NO", None: "-"}[row.met],
        )
        for row in rows
    ]
    widths = [max(len(str(line[column])) for line in table) for column in range(len(header))]
    for index, line in enumerate(table):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
