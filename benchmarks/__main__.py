"""Benchmarks, each measured side by side in one process: `python -m benchmarks [--quick] [--only NAME ...]`.

    python -m benchmarks --check                  # exit 1 when a row misses its target
    python -m benchmarks --markdown > docs/reference/benchmarks.md   # the page the docs show, every case
    python -m benchmarks --only demo serving --update docs/reference/benchmarks.md   # remeasure those sections

Prints one table: a row per figure, this project's number, the baseline's, the
ratio and the target. Each case runs in a fresh process, so no case inherits
another's threads, caches or allocator state (the trainer rows read 0.96 after
the reader rows in one process, 1.00 alone). Data is generated into a temporary
folder; nothing is downloaded. Absolute numbers depend on the machine; the
ratios are the point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import cases
from benchmarks.common import ROOT, Row

MARKER = "BENCHMARK ROWS "
CASE = (
    "import dataclasses, json, pathlib, sys; from benchmarks.cases import CASES; "
    "rows = CASES[sys.argv[1]](pathlib.Path(sys.argv[2]), sys.argv[3] == '1'); "
    f"print({MARKER!r} + json.dumps([dataclasses.asdict(row) for row in rows]))"
)
MET = {True: "yes", False: "NO", None: "-"}
HEADER = ("figure", "ours", "baseline", "unit", "ratio", "target", "met")


def run_case(name: str, folder: str, quick: bool) -> list[Row]:
    """The rows of one case, measured in a fresh Python process (its log lines pass through to stderr)."""
    command = [sys.executable, "-c", CASE, name, folder, str(int(quick))]
    output = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    line = next(line for line in reversed(output.splitlines()) if line.startswith(MARKER))
    return [Row(**row) for row in json.loads(line[len(MARKER) :])]


def _cells(row: Row) -> tuple[str, ...]:
    return (
        row.figure,
        f"{row.ours:,.1f}",
        f"{row.baseline:,.1f}",
        row.unit,
        f"{row.ratio:.2f}",
        row.target_text,
        MET[row.met],
    )


def text_table(rows: list[Row]) -> str:
    table = [HEADER, *(_cells(row) for row in rows)]
    widths = [max(len(line[column]) for line in table) for column in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _commit() -> str:
    """The commit measured, `abc1234` (`abc1234+changes` with uncommitted changes to tracked files); `an
    unknown commit` outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "an unknown commit"
    if commit.returncode != 0:
        return "an unknown commit"
    return f"commit {commit.stdout.strip()}{'+changes' if dirty.stdout.strip() else ''}"


PAGE_INTRO = """# Benchmark figures

Each row is measured side by side in one process on this machine: this project's
number, its baseline's, the ratio and the target. `python -m benchmarks --check` exits
with 1 when a row misses its target. This page is the output of
`python -m benchmarks --markdown` (or, section by section, `--only NAME --update` of this page), committed as it came
out (never edited by hand): each section says when, at which commit and where it was measured."""
SECTION = "## "


def markdown_section(name: str, rows: list[Row], quick: bool) -> str:
    """One case's table, headed by when, at which commit and where it was measured."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}"
    lines = [
        f"{SECTION}{name}",
        "",
        f"Measured by `python -m benchmarks --only {name}{' --quick' if quick else ''}` on {when} at {_commit()} "
        f"({where}).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join(["---", "---:", "---:", "---", "---:", "---", "---"]) + "|",
    ]
    for row in rows:
        cells = list(_cells(row))
        cells[0] = cells[0].strip().replace("|", "\\|")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_page(sections: dict[str, str]) -> str:
    """The page: the introduction, then the sections in the order of `cases.CASES`."""
    order = list(cases.CASES)
    names = sorted(sections, key=order.index)
    return "\n\n".join([PAGE_INTRO, *(sections[name] for name in names)]) + "\n"


def page_sections(page: str) -> dict[str, str]:
    """The sections of a page that `markdown_page` wrote, by case name."""
    parts = page.split("\n" + SECTION)[1:]
    return {part.split("\n", 1)[0].strip(): (SECTION + part).rstrip("\n") for part in parts}


def update_page(path: Path, sections: dict[str, str]) -> None:
    """Replace (or add) these sections of the page at `path`, keeping every other case's section as it was
    measured (a section of a case that no longer exists goes)."""
    page = page_sections(path.read_text()) if path.exists() else {}
    page = {name: section for name, section in page.items() if name in cases.CASES}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(markdown_page({**page, **sections}))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer steps (a smoke run)")
    parser.add_argument("--only", nargs="*", choices=sorted(cases.CASES), help="run only these rows")
    parser.add_argument("--check", action="store_true", help="exit with 1 when a row misses its target")
    parser.add_argument("--markdown", action="store_true", help="print the page as Markdown, for the docs")
    parser.add_argument("--update", type=Path, metavar="PAGE", help="replace the measured cases' sections of PAGE")
    args = parser.parse_args(argv)
    names = args.only or list(cases.CASES)
    rows, failed, sections = [], [], {}
    with tempfile.TemporaryDirectory(prefix="vggtrain-bench-") as folder:
        for name in names:
            started = time.perf_counter()
            print(f"# {name} ...", file=sys.stderr, flush=True)
            try:
                case_rows = run_case(name, folder, args.quick)
            except subprocess.CalledProcessError:  # its traceback is above; the other cases still run
                failed.append(name)
                print(f"# {name} FAILED", file=sys.stderr, flush=True)
                continue
            rows += case_rows
            sections[name] = markdown_section(name, case_rows, args.quick)
            print(f"# {name} took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if args.update:
        update_page(args.update, sections)  # a failed case keeps the section it had
    if args.markdown:
        print(markdown_page(sections), end="")
    else:
        print(text_table(rows))
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    missed = [row.figure.strip() for row in rows if row.met is False]
    if args.check and missed:
        print(f"{len(missed)} row(s) missed their target: {'; '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
