"""The data check before hours of training: every example of every split decoded, counted and hashed.

    python run.py mode=inspect inspect.check=true dataset=folder dataset.data_dir=photos/
    python run.py mode=inspect inspect.check=true inspect.allow=[duplicates] dataset=cifar dataset.data_dir=DIR

`check_splits` reads each split once through its evaluation pipeline (the pixels the model
is evaluated on) and reports the class counts per split, exact duplicates within a split,
and the same image in two splits (a test image that is also in train is leakage), each
named by its file where the dataset part knows it (`dataset=folder`), else by split and
position. The part's own bad files (those `dataset=folder` left out at start-up) come in
as `bad`.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

SPLITS = ("train", "val", "test")
LARGE_PIXELS = 12_000_000  # a phone photo's 12 MP: decoding many of them is what makes a folder slow
UNREADABLE = "is corrupted or truncated: the rest of the file cannot be read"  # a broken frame's reason
# ... in a compressed file, where the records read before a decompression error may stop short of the damage
UNREADABLE_FROM = (
    "cannot be read: the compressed file is corrupted or truncated at or after it; nothing after it can be read"
)


def unreadable(exact: bool) -> str:
    """A broken frame's reason: `UNREADABLE` where the record is known (an uncompressed file's frames), else
    `UNREADABLE_FROM` (a compressed file: the first record that could not be read, the damage at or after it)."""
    return UNREADABLE if exact else UNREADABLE_FROM


def record_line(file: str, number: int, reason: str = "") -> str:
    """`FILE: record N REASON`: how every caller names a bad record (its provenance, then the decoder's reason)."""
    return f"{file}: record {number}{' ' if reason else ''}{reason}"


def record_entry(file: str, number: int, reason: str) -> dict:
    """A bad record of the report: {"file": "FILE: record N", "record": N, "reason"}."""
    return {"file": record_line(file, number), "record": number, "reason": reason}


def describe(entry: dict) -> str:
    """A bad file or record as one line, the house format: `FILE: record N REASON` (its `file` names the record),
    `FILE: REASON` for a whole file."""
    if "record" in entry:
        return f"{entry['file']} {entry['reason']}"
    return f"{entry['file']}: {entry['reason']}"


def _hashes(batches: Iterable[tuple]) -> tuple[list[bytes], list[int], Counter]:
    """(fingerprint of each image's pixels, its label, image shapes) in pipeline order. A fingerprint is
    `tf.fingerprint`'s 64-bit FarmHash, stable across platforms and TF versions: two different images share one
    with odds of about n^2 / 2^65 (4e-8 for ImageNet's 1.28M). sha256 in Python took a third of the converter's
    check of 3,000 photos."""
    hashes, labels, shapes = [], [], Counter()
    for images, batch_labels in batches:
        if not len(images):  # every record of the batch was bad (inspect's `_good`): no image, no size
            continue
        hashes += [row.tobytes() for row in tf.fingerprint(images).numpy()]
        shapes["x".join(map(str, images.shape[1:]))] += len(images)
        labels += np.asarray(batch_labels).tolist()
    return hashes, labels, shapes


def check_splits(
    datasets: dict[str, Iterable[tuple]],
    class_names: list[str],
    name_of: Callable[[str, int], str],
    bad: list[dict] | None = None,
    sizes: dict[str, int] | None = None,
) -> dict:
    """The report of `mode=inspect inspect.check=true`.

    Args:
        datasets: Each split once, in order, as (uint8 images, int labels) batches. A split that is another
            split's records (the test split standing in for val) is passed once.
        class_names: The labels' names.
        name_of: (split, position in the split) -> what the user calls that example (a file, a record).
        bad: Files or records the dataset part left out, each {"file", "reason"}.
        sizes: Stored image sizes ("HxW" -> count), where the part knows them.

    Returns:
        {"bad", "per_class", "image_sizes", "duplicates", "leakage", "conflicts", "num_examples"}: duplicates per
        split as groups of names, leakage as {"splits": [a, b], "examples": [name in a, name in b]} entries,
        conflicts as {"examples": [names], "labels": [their class names]} for each image held under two labels or
        more (in any splits), the image sizes ("HxW", height first) summarised (`summarise_sizes`).
    """
    seen: dict[bytes, list[tuple[str, int, int]]] = defaultdict(list)
    report = {"bad": list(bad or []), "num_examples": {}, "per_class": {}, "duplicates": {}, "leakage": []}
    report["conflicts"] = []
    shapes = Counter()
    for split, dataset in datasets.items():
        hashes, labels, split_shapes = _hashes(dataset)
        shapes.update(split_shapes)
        counts = Counter(labels)
        report["num_examples"][split] = len(hashes)
        report["per_class"][split] = {name: counts.get(index, 0) for index, name in enumerate(class_names)}
        for position, (digest, label) in enumerate(zip(hashes, labels, strict=True)):
            seen[digest].append((split, position, label))
    for places in seen.values():
        if len({label for _, _, label in places}) > 1:
            report["conflicts"].append(_conflict(places, class_names, name_of))
        by_split = defaultdict(list)
        for split, position, _ in places:
            by_split[split].append(name_of(split, position))
        for split, names in by_split.items():
            if len(names) > 1:
                report["duplicates"].setdefault(split, []).append(names)
        present = [split for split in SPLITS if split in by_split]
        for index, first in enumerate(present):
            for other in present[index + 1 :]:
                examples = [by_split[first][0], by_split[other][0]]
                report["leakage"].append({"splits": [first, other], "examples": examples})
    report["image_sizes"] = summarise_sizes(sizes or shapes)
    return report


def _conflict(places: list[tuple[str, int, int]], class_names: list[str], name_of: Callable) -> dict:
    """One image held under several labels: {"examples": [its names], "labels": [the class of each]}."""
    named = lambda label: class_names[label] if 0 <= label < len(class_names) else str(label)  # noqa: E731
    return {
        "examples": [name_of(split, position) for split, position, _ in places],
        "labels": [named(label) for _, _, label in places],
    }


def summarise_sizes(sizes: dict[str, int]) -> dict:
    """{"count", "min", "median", "max", "over_12_mp"} of image sizes given as {"HxW[xC]": count}: the
    smallest, median and largest by pixels ("HxW"), and how many hold more than 12 megapixels. Sizes a header
    does not tell ("unknown") are counted, as `unknown`, and left out of the rest."""
    known = sorted(
        ((int(height) * int(width), f"{height}x{width}", count)
         for key, count in sizes.items() if key != "unknown"
         for height, width in [key.split("x")[:2]]),
    )  # fmt: skip
    total = sum(count for _, _, count in known)
    summary = {"count": total + sizes.get("unknown", 0)}
    if sizes.get("unknown"):
        summary["unknown"] = sizes["unknown"]
    if not known:
        return summary
    ends = list(itertools.accumulate(count for _, _, count in known))  # the last image of each size, counted
    median = next(size for (_, size, _), end in zip(known, ends, strict=True) if end > (total - 1) // 2)  # lower median
    over = sum(count for pixels, _, count in known if pixels > LARGE_PIXELS)
    return {**summary, "min": known[0][1], "median": median, "max": known[-1][1], "over_12_mp": over}


def problems(report: dict, allow: list[str]) -> list[str]:
    """What makes the check fail: bad files or records unless `allow` names `bad`; an image in two splits
    (leakage) or under two labels unless it names `duplicates`. Duplicates within a split only are reported."""
    found = []
    if report["bad"] and "bad" not in allow:
        found.append(f"{len(report['bad'])} bad file(s) or record(s), e.g. {describe(report['bad'][0])}")
    if report["conflicts"] and "duplicates" not in allow:
        first = report["conflicts"][0]
        found.append(
            f"{len(report['conflicts'])} image(s) under two labels, e.g. {first['examples'][0]} "
            f"({first['labels'][0]}) is {first['examples'][1]} ({first['labels'][1]})"
        )
    if report["leakage"] and "duplicates" not in allow:
        first = report["leakage"][0]
        found.append(
            f"{len(report['leakage'])} image(s) in two splits, e.g. {first['examples'][1]} ({first['splits'][1]}) is "
            f"{first['examples'][0]} ({first['splits'][0]})"
        )
    return found
