"""Which records a pipeline reads (`Records`: ranges of files), and each worker's share under multi-worker training.

A split is the records of whole files, or a range of them (a validation tail). Under
`strategy=multi_worker`, each worker's input pipeline reads only its own share, planned before anything is read
(`distribute_datasets_from_function` hands each pipeline its `InputContext`):

- whole files (every num_workers-th file) when there are at least as many files as workers
  and the shares then differ by at most one step's worth of records;
- otherwise contiguous record ranges of total / num_workers records each (fixed-length
  binary records turn a range into a byte range of its file).

Every worker runs the same number of steps per epoch, set by the smallest share, and reads
exactly that many steps' records per pass of its share, so no record is read twice in one
epoch and no worker waits for another. Together the shares hold every record of the split once.

    TF_CONFIG=... python run.py strategy=multi_worker dataset=cifar
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.errors import ConfigError

Range = tuple[str, int, int]  # (file, first record, number of records; -1: to the end of the file)


@dataclass(frozen=True)
class Records:
    """Which records a pipeline reads: ranges of files, read in order, and how many records they hold."""

    ranges: tuple[Range, ...]
    count: int  # records in the ranges
    # One worker's share: records read per epoch (= steps per epoch x records per step), the rest wait for a
    # later pass; None: the records of a whole split, read whole every pass.
    per_epoch: int | None = None

    @classmethod
    def whole_files(cls, files: list[str], count: int) -> Records:
        return cls(tuple((path, 0, -1) for path in files), count)

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(path for path, _, _ in self.ranges))


@dataclass(frozen=True)
class SharePlan:
    """The shares of every input pipeline, and the steps per epoch all of them run."""

    workers: tuple[Records, ...]
    whole_files: bool
    steps_per_epoch: int
    num_files: int

    def describe(self, index: int) -> str:
        """One log line's worth: what input pipeline `index` reads, and why every worker runs the same steps."""
        share = self.workers[index]
        if self.whole_files:
            what = f"{len(share.ranges)} of {self.num_files} whole file(s)"
        else:
            ranges = (f"{start}-{start + length - 1} of {path}" for path, start, length in share.ranges)
            what = "records " + ", ".join(ranges)
        smallest = min(worker.count for worker in self.workers)
        unread = f", {share.count - share.per_epoch} left for later passes" if share.count > share.per_epoch else ""
        return (
            f"{what} ({share.count} records, {share.per_epoch} per epoch{unread}); every worker's share holds "
            f"{self.steps_per_epoch} steps per epoch, set by the smallest share ({smallest} records)"
        )


def ranges_of(files: list[str], counts: list[int], start: int, end: int) -> tuple[Range, ...]:
    """Records [start, end) of the files read in order, as per-file ranges."""
    ranges, offset = [], 0
    for path, count in zip(files, counts, strict=True):
        low, high = max(start, offset), min(end, offset + count)
        if low < high:
            ranges.append((path, low - offset, high - low))
        offset += count
    return tuple(ranges)


def plan(
    files: list[str], counts: list[int], num_workers: int, records_per_step: int, limit: int | None = None
) -> SharePlan:
    """Splits the first `limit` records of `files` (all of them by default) among `num_workers` input pipelines.

    Args:
        files: The split's files, in reading order.
        counts: Records per file.
        num_workers: Input pipelines (`InputContext.num_input_pipelines`).
        records_per_step: Records one pipeline feeds per step (global batch / num_workers).
        limit: Only the first `limit` records belong to the split (a validation split carved off the end).

    Returns:
        The plan; `workers[i]` is input pipeline i's share.

    Raises:
        ConfigError: the smallest share holds fewer records than one step (fewer records than workers).
    """
    total = sum(counts) if limit is None else limit
    whole = limit is None or limit == sum(counts)
    if whole and len(files) >= num_workers:
        shares = [tuple((path, 0, -1) for path in files[index::num_workers]) for index in range(num_workers)]
        sizes = [sum(counts[index::num_workers]) for index in range(num_workers)]
        whole = max(sizes) - min(sizes) <= records_per_step  # else whole files would leave a worker idle or repeating
    else:
        whole = False
    if not whole:
        bounds = [total * index // num_workers for index in range(num_workers + 1)]
        shares = [ranges_of(files, counts, bounds[index], bounds[index + 1]) for index in range(num_workers)]
        sizes = [bounds[index + 1] - bounds[index] for index in range(num_workers)]
    steps = min(sizes) // records_per_step
    if steps < 1:
        raise ConfigError(
            f"the {total} training records cannot feed {num_workers} workers: each needs {records_per_step} "
            f"records per step (trainer.batch_size over the workers), but the smallest share holds {min(sizes)}; "
            "use fewer workers or a smaller trainer.batch_size"
        )
    workers = tuple(Records(share, size, steps * records_per_step) for share, size in zip(shares, sizes, strict=True))
    return SharePlan(workers, whole, steps, len(files))
