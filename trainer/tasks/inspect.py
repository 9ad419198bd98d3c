"""`mode=inspect`: look at the data exactly as the pipeline yields it, labels included.

    python run.py mode=inspect dataset=cifar inspect.split=train inspect.num_images=64 inspect.augmented=true
    python run.py mode=inspect dataset=folder dataset.data_dir=photos/ inspect.check=true   # the data check

Writes contact_sheet.png (each tile captioned with its label's class name) and
inspect.json (per-class counts, shape, dtype, value range) into the run folder.
The images are the uint8 pixels the model takes; with `inspect.augmented=true` they
also get MixUp/CutMix (captioned with both classes and their shares) and the model's own
training-time flip, colour jitter, policy and erasing, as the network sees them before its
normalization layer. `inspect.check=true` also decodes every example of every split and writes
data_check.json (`trainer.data.check`): bad files, class counts, image sizes, duplicates and leakage
across splits; it exits 1 on bad files or leakage unless `inspect.allow` accepts them. A bad record is
named by the pipeline itself (`DataModule.checked`: its file, its number and the decoder's reason), one
line each, and counted; a corrupted TFRecord frame is one too, after which its file cannot be read, and the check
reads the split's other files. The contact sheet shows the good ones. Without the check, a bad record among the
sheet's stops the run (exit 1) once the sheet is written, as it would stop training.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from trainer.config.schema import Config
from trainer.data.augmentation import Augmentation
from trainer.data.check import check_splits, describe, problems, record_entry
from trainer.data.images import stored_sizes
from trainer.data.module import miscounted
from trainer.data.pipeline import checked_dataset
from trainer.data.sources import TFRecordReader
from trainer.data.tfrecords import cuts_before, readable_rest
from trainer.errors import DataError
from trainer.models.preprocessing import augmentation_layers
from trainer.runs.atomic import write_json
from trainer.tasks.data import load_data
from trainer.tracking.sheets import contact_sheet, save_png

log = logging.getLogger(__name__)


def _first_images(dataset, count: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels, total = [], [], 0
    for batch_images, batch_labels in dataset:
        images.append(batch_images.numpy())
        labels.append(batch_labels.numpy())
        total += len(batch_labels)
        if total >= count:
            break
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def _good(
    batches: tf.data.Dataset, bad: list[dict], say: bool = True, read: list | None = None
) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
    """The (images, labels) of the good records of `DataModule.checked` batches; each bad one goes to `bad`
    (`check.record_entry`), and with `say` to the log as one line; `read` keeps the (file, number) read last."""
    for images, labels, reasons, files, numbers in batches:
        reasons = reasons.numpy()
        for at in np.flatnonzero(reasons != b""):
            _bad(bad, record_entry(os.fsdecode(files[at].numpy()), int(numbers[at]), reasons[at].decode()), say)
        if read is not None:
            read[:] = [os.fsdecode(files[-1].numpy()), int(numbers[-1])]
        good = reasons == b""
        yield tf.boolean_mask(images, good), tf.boolean_mask(labels, good)


def _bad(bad: list[dict], entry: dict, say: bool) -> None:
    bad.append(entry)
    if say:
        log.warning("Bad record %s", describe(entry))


def _every_readable(data, split: str, bad: list[dict], say: bool = True) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
    """`_good` of a whole split for the data check. A corrupted TFRecord frame ends its file (nothing after it
    can be read) but not the check: it is a bad record, and the split's other files are still read. A frame cut
    inside its header ends its file's read quietly: the split then falls short of its count (a manifest's), and
    the cut is listed once the rest is read, or once a later broken frame's file and those after it are."""
    read: list = []
    source = data.splits.sources[split]
    try:
        yield from _good(data.checked(split), bad, say, read)
    except tf.errors.DataLossError:  # the rest file by file, each broken frame listed after its file's records
        after = tuple(read) if read else None
        for readable, broken in readable_rest(source, after):
            if readable is not None:
                batches = checked_dataset(readable, data.splits.decoder, data.preprocess, data.batches.batch_size)
                yield from _good(batches, bad, say)
            if broken is not None:
                _bad(bad, broken, say)
        for broken in cuts_before(source, after):  # the files read whole before it may have ended at a cut
            _bad(bad, broken, say)
    except tf.errors.FailedPreconditionError as error:  # every record that could be read was read: name the cut
        cut = miscounted(error) and isinstance(source.reader, TFRecordReader)
        found = [broken for _, broken in readable_rest(source, None) if broken is not None] if cut else []
        if not found:
            raise
        for broken in found:
            _bad(bad, broken, say)


def _with_model_augmentation(images: np.ndarray, augment: Augmentation, seed: int) -> np.ndarray:
    """The model's training-time flip and colour jitter applied to the host's uint8 images, for display."""
    pixels = images.astype(np.float32)  # float32 already when MixUp or CutMix mixed them
    for layer in augmentation_layers(augment, seed):
        pixels = np.asarray(layer(pixels, training=True))
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _caption(label: np.ndarray, class_names: list[str]) -> str:
    """A label's class name; a MixUp or CutMix label's two largest shares (`cat 70%/dog 30%`)."""
    if np.ndim(label) == 0:
        return class_names[label] if 0 <= label < len(class_names) else "?"
    largest = [index for index in np.argsort(label)[::-1][:2] if label[index] >= 0.005]  # shares shown as >= 1%
    shares = [(float(label[index]), class_names[index]) for index in largest]
    return "/".join(f"{name} {share:.0%}" for share, name in shares) if len(shares) > 1 else shares[0][1]


def _count(dataset, total: int, class_names: list[str]) -> dict[str, int]:
    counts = Counter()
    with tqdm(total=total, unit="img", desc="counting labels", disable=None) as progress:
        for _, labels in dataset:
            counts.update(labels.numpy().tolist())
            progress.update(len(labels))
    return {name: counts.get(index, 0) for index, name in enumerate(class_names)}


def inspect(settings: Config) -> None:
    """Writes the contact sheet and prints the split's statistics; with `inspect.check=true`, checks every split.

    Raises:
        DataError: the check found bad files or records, or leakage, that `inspect.allow` does not accept.
    """
    options = settings.inspect
    check_val = options.split == "val" or options.check
    reads = ("train", "val", "test") if options.check else (options.split,)
    data = load_data(
        settings.dataset,
        min(options.num_images, 256),
        settings.seed,
        check_val=check_val,
        reads=reads,
        list_bad=options.check,  # the check counts and lists every bad record, a corrupted frame too
        check_records=not options.check,  # binary labels: the check reads every record's reason and lists them
    )
    with data.named_bad_records():
        _inspect(settings, data)
        if options.check:
            _check(settings, data)


def _check(settings: Config, data) -> None:
    """Decodes every example of every split; writes data_check.json; one line when something is wrong."""
    bad = []
    splits = {split: _every_readable(data, split, bad) for split in ("train", "val", "test")}
    if data.fingerprint.get("test") == data.fingerprint.get("val"):
        del splits["test"]  # the test split is the validation split: checked once
    listed = {split: part.get("files", []) for split, part in data.fingerprint.items()}
    by_file = all(len(entry) == 3 for entries in listed.values() for entry in entries)  # a folder's file list

    def name_of(split: str, position: int) -> str:
        return listed[split][position][0] if by_file else f"{split} #{position}"

    sizes = None
    if by_file and settings.dataset.data_dir:
        root = Path(settings.dataset.data_dir)
        sizes = stored_sizes([str(root / entry[0]) for entries in listed.values() for entry in entries])
    report = check_splits(splits, data.class_names, name_of, data.skipped, sizes)
    # The records the pipeline gave a reason, as each split was read; a frame cut inside its header that the
    # part listed at start-up (no manifest) is met again when a split is read past another broken frame.
    report["bad"] += [entry for entry in bad if entry not in report["bad"]]
    run_dir = Path(settings.output_dir)
    write_json(run_dir / "data_check.json", report)
    duplicates = sum(len(groups) for groups in report["duplicates"].values())
    print(
        f"data check: {sum(report['num_examples'].values())} examples decoded, {len(report['bad'])} bad, "
        f"{duplicates} group(s) of duplicates within a split, {len(report['leakage'])} image(s) in two splits, "
        f"{len(report['conflicts'])} under two labels; "
        f"per class: {report['per_class']}; {run_dir / 'data_check.json'}"
    )
    found = problems(report, list(settings.inspect.allow))
    if found:
        raise DataError(
            f"data check: {'; '.join(found)} (see {run_dir / 'data_check.json'}; accept knowingly with "
            f"inspect.allow=[duplicates] or [bad])"
        )


def _inspect(settings: Config, data) -> None:
    options = settings.inspect
    if options.augmented and options.split != "train":
        log.warning("inspect.augmented=true applies to the train split only; showing %s unaugmented", options.split)
    augmented = options.augmented and options.split == "train"
    bad: list[dict] = []  # the sheet's bad records: inspect.check lists them all, else the first stops the run
    if augmented:
        dataset = data.train()
    elif options.check:  # a corrupted frame among the sheet's records: the check lists it, the run goes on
        dataset = _every_readable(data, options.split, bad, say=False)
    else:
        dataset = _good(data.checked(options.split), bad, say=False)
    images, labels = _first_images(dataset, options.num_images)
    if options.augmented and options.split == "train":
        images = _with_model_augmentation(images, data.augment, settings.seed)
    captions = [_caption(label, data.class_names) for label in labels]
    run_dir = Path(settings.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sheet = save_png(contact_sheet(images, captions), run_dir / "contact_sheet.png")

    plain = _every_readable(data, options.split, [], say=False) if options.check else data.split(options.split)
    counts = (data.class_counts or {}).get(options.split) or _count(
        plain, data.num_examples[options.split], data.class_names
    )
    stats = {
        "split": options.split,
        "augmented": options.augmented,
        "num_examples": data.num_examples[options.split],
        "per_class": counts,
        "image_shape": list(images.shape[1:]),
        "dtype": str(images.dtype),
        "min": float(images.min()),
        "max": float(images.max()),
        "mean": float(images.mean()),
        "contact_sheet": str(sheet),
        "cache": data.cache_entries,
    }
    write_json(run_dir / "inspect.json", stats)
    print(f"{options.split}: {stats['num_examples']} examples; per class: {counts}")
    print(f"images {tuple(images.shape[1:])} {images.dtype}, values in [{stats['min']:.3f}, {stats['max']:.3f}]")
    print(f"contact sheet of {len(images)} images: {sheet}")
    for split, entry in data.cache_entries.items():
        print(f"{split} cache: {_cache_line(entry)} <dataset.cache={settings.dataset.cache}>")
    if bad and not options.check:  # the sheet is written; the exit says the split holds a record training refuses
        more = f" ({len(bad) - 1} more among the sheet's; inspect.check=true lists every one)" if len(bad) > 1 else ""
        raise DataError(f"{describe(bad[0])}{more}")


def _cache_line(entry: dict) -> str:
    if entry["mode"] != "disk":
        return {"memory": "in memory, during a run", "off": "none"}[entry["mode"]]
    state = f"{entry['bytes'] / 2**20:.1f} MB" if entry["written"] else "not written yet (the first run writes it)"
    return f"key {entry['key']}, {state}, at {entry['place']} (delete the folder to clear it)"
