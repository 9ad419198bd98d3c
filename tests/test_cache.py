"""`dataset.cache`: photos decoded once, in memory or on disk, keyed by what determines their pixels; a killed or
concurrent writer, and a full disk, never give a run a half-written cache."""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_decode import _awkward_files
from test_folder import make_folder

from conftest import compose, write_cifar
from trainer.config.store import to_settings
from trainer.data import cache as data_cache
from trainer.data.cache import MANIFEST, Cache, key_name
from trainer.tasks.data import load_data

pytestmark = pytest.mark.integration


def _numbers(count: int = 64) -> tf.data.Dataset:
    """(image, label) pairs whose pixels are their label: what came back is what went in, in order."""
    return tf.data.Dataset.range(count).map(
        lambda index: (tf.fill([32, 32, 3], tf.cast(index, tf.uint8)), tf.cast(index, tf.int32))
    )


def _labels(dataset: tf.data.Dataset) -> list[int]:
    return [int(label) for _, label in dataset]


def _folder_settings(root: Path, *extra: str):
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.val_fraction=0.25", "debug=smoke", *extra]
    return to_settings(compose(overrides)).dataset


def test_a_second_load_reads_the_disk_cache_and_another_size_or_mode_is_another_key(tmp_path, caplog):
    root = make_folder(tmp_path / "photos", per_class=8)
    cache_dir = tmp_path / "cache"
    first = ["dataset.cache=disk", f"dataset.cache_dir={cache_dir}", "dataset.image_size=32"]
    caplog.set_level(logging.INFO, "trainer.data.cache")
    batches = [[(images.numpy(), labels.numpy()) for images, labels in load_data(
        _folder_settings(root, *first), 4, 0).train().take(6)] for _ in range(2)]  # fmt: skip
    assert not any(record.message.startswith("Decoding") for record in caplog.records), "the check's pixels kept"
    assert sum("read from the cache" in record.message for record in caplog.records) == 2, "read by both runs"
    for (images_a, labels_a), (images_b, labels_b) in zip(*batches, strict=True):
        np.testing.assert_array_equal(labels_a, labels_b)
        np.testing.assert_array_equal(images_a, images_b)
    pixels = {}
    for mode in ("off", "disk"):  # the val split, in order: the one decode's pixels, cached or not
        val = load_data(_folder_settings(root, f"dataset.cache={mode}", *first[1:]), 4, 0).split("val")
        pixels[mode] = np.concatenate([images.numpy() for images, _ in val])
    np.testing.assert_array_equal(pixels["off"], pixels["disk"])
    keys = {path.name for path in cache_dir.iterdir()}
    assert len(keys) == 2, "train and val"
    for other in (["dataset.image_size=48"], ["dataset.image_size=32", "dataset.resize_mode=crop"]):
        data = load_data(_folder_settings(root, *first[:2], *other), 4, 0)
        assert {entry["key"] for entry in data.cache_entries.values()}.isdisjoint(keys), other
    (root / "cat" / "0.png").write_bytes((root / "dog" / "0.png").read_bytes())  # a changed file
    data = load_data(_folder_settings(root, *first), 4, 0)
    assert {entry["key"] for entry in data.cache_entries.values()} != keys


def test_a_photo_rewritten_at_the_same_size_is_decoded_again_not_read_from_the_disk_cache(tmp_path):
    from PIL import Image

    root, shades = tmp_path / "photos", {"cat": (0, 40, 80, 120), "dog": (140, 180, 220, 250)}
    for name, values in shades.items():
        (root / name).mkdir(parents=True)
        for value in values:  # uncompressed BMPs: every file of one class the same size
            Image.fromarray(np.full((20, 20, 3), value, np.uint8)).save(root / name / f"{value}.bmp")
    overrides = ["dataset.cache=disk", f"dataset.cache_dir={tmp_path / 'cache'}", "dataset.image_size=32"]

    def val_pixels() -> np.ndarray:
        val = load_data(_folder_settings(root, *overrides), 4, 0).split("val")
        return np.concatenate([images.numpy() for images, _ in val])

    first = val_pixels()
    for value in shades["cat"] + shades["dog"]:  # new contents, the same sizes and names: the fingerprint is blind
        path = next(root.glob(f"*/{value}.bmp"))
        Image.fromarray(np.full((20, 20, 3), 255 - value, np.uint8)).save(path)
    second = val_pixels()
    assert not np.array_equal(first, second), "the old pixels came back from the cache"
    np.testing.assert_array_equal(second, 255 - first)


def _awkward_folder(root: Path) -> Path:
    """`make_folder`'s splits, and in train/cat/ and val/dog/ the kinds a photo folder holds: an EXIF-rotated, a
    CMYK, a grayscale JPEG, a PNG with alpha, a PNG named .jpg and a truncated JPEG."""
    root = make_folder(root, "splits", per_class=2)
    for folder in (root / "train" / "cat", root / "val" / "dog"):
        for name, data in _awkward_files().items():
            (folder / name).write_bytes(data)
        (folder / "png_named.jpg").write_bytes((root / "test" / "cat" / "0.png").read_bytes())
        (folder / "truncated.jpg").write_bytes((root / "test" / "cat" / "1.jpg").read_bytes()[:300])
    return root


def test_the_checks_pixels_are_the_cache_and_equal_the_pipelines_decode_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = _awkward_folder(tmp_path / "photos")
    settings = [f"dataset.cache_dir={tmp_path / 'decoded'}", "dataset.image_size=32"]
    cached = load_data(_folder_settings(root, "dataset.cache=disk", *settings), 4, 0)
    assert sorted(entry["file"] for entry in cached.skipped) == ["train/cat/truncated.jpg", "val/dog/truncated.jpg"]
    entries = cached.cache_entries
    assert all(entry["written"] for entry in entries.values()), "written by the start-up check, before any pass"
    plain = load_data(_folder_settings(root, "dataset.cache=off", *settings), 4, 0)
    for split in ("train", "val"):  # the entry as the check saved it, against the pipeline's decode of each file
        kept = list(tf.data.Dataset.load(entries[split]["place"]).as_numpy_iterator())
        decoded = [pair for images, labels in plain.split(split, stored=True) for pair in zip(*(images.numpy(),
                   labels.numpy()), strict=True)]  # fmt: skip
        assert len(kept) == len(decoded) == plain.num_examples[split] == 9
        for (kept_image, kept_label), (image, label) in zip(kept, decoded, strict=True):
            assert kept_label == label and kept_image.dtype == image.dtype == np.uint8
            np.testing.assert_array_equal(kept_image, image)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another"))  # no verdicts kept: the check decodes again
    held = load_data(_folder_settings(root, "dataset.cache=memory", *settings[1:]), 4, 0)  # its pixels in memory
    vals = (data.split("val", stored=True) for data in (cached, held, plain))
    for *kept, decoded in zip(*vals, strict=True):
        for images, labels in kept:  # read back as such, from disk and from memory
            np.testing.assert_array_equal(images.numpy(), decoded[0].numpy())
            np.testing.assert_array_equal(labels.numpy(), decoded[1].numpy())
    for from_disk, from_memory in zip(cached.train().take(3), held.train().take(3), strict=True):  # one stream
        np.testing.assert_array_equal(from_disk[0].numpy(), from_memory[0].numpy())


def test_of_two_checks_saving_one_key_at_once_one_entry_is_kept(tmp_path):
    cache = Cache("disk", str(tmp_path))
    batch = (np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3), np.array([0, 1], np.int32))
    partials = [data_cache.save_decoded(iter([batch]), 4, str(tmp_path)) for _ in range(2)]
    for partial in partials:
        cache.publish(partial, [("x", 0, -1)], 2)
    (entry,) = tmp_path.iterdir()
    assert entry.name == key_name(cache.key([("x", 0, -1)])) and (entry / MANIFEST).is_file(), "no partial left"
    assert _labels(tf.data.Dataset.load(str(entry))) == [0, 1]


def test_a_check_stopped_part_way_leaves_no_entry_and_stops_at_once(tmp_path):
    """Ctrl-C reaches the check's own loop, not a save that runs to its end first; what was saved goes."""

    def stopped():
        yield np.zeros([2, 4, 4, 3], np.uint8), np.zeros([2], np.int32)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        data_cache.save_decoded(stopped(), 4, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_auto_keeps_photos_in_memory_or_on_disk_by_their_size_and_leaves_raw_pixels_alone(tmp_path):
    root = make_folder(tmp_path / "photos", per_class=4)
    assert load_data(_folder_settings(root), 4, 0).cache_entries["train"] == {"mode": "memory"}
    on_disk = load_data(_folder_settings(root, "dataset.cache_memory_mb=0", f"dataset.cache_dir={tmp_path}/c"), 4, 0)
    assert on_disk.cache_entries["train"]["mode"] == "disk" and not on_disk.cache_entries["train"]["written"]
    cifar = write_cifar(tmp_path / "cifar")
    raw = to_settings(compose(["dataset=cifar", f"dataset.data_dir={cifar}", "dataset.val_size=16"])).dataset
    assert load_data(raw, 4, 0).cache_entries["train"] == {"mode": "off"}


@pytest.mark.parametrize("value, mode", [("true", "memory"), ("false", "off")])
def test_the_old_boolean_is_read_with_one_line(value, mode, caplog):
    assert to_settings(compose([f"dataset.cache={value}"])).dataset.cache == mode
    assert f"dataset.cache={value.capitalize()} is dataset.cache={mode} now" in caplog.text


def test_each_share_of_a_split_has_its_own_key():
    cache = Cache("disk", "unused", {"data": {"train": 1}, "image_size": 32, "resize_mode": "resize"})
    halves = [[("a.tfrecord", 0, 50)], [("a.tfrecord", 50, 50)]]
    assert key_name(cache.key(halves[0])) != key_name(cache.key(halves[1]))


def test_a_killed_writers_leftovers_are_never_read_and_are_removed(tmp_path):
    cache = Cache("disk", str(tmp_path))
    name = key_name(cache.key([("x", 0, -1)]))
    (tmp_path / name).mkdir()  # a folder of the key without its manifest: not a cache
    (tmp_path / name / "junk").write_text("half")
    dead = next(pid for pid in range(999_999, 0, -1) if not Path(f"/proc/{pid}").exists())  # no process has it
    (tmp_path / f".{name}.{dead}.0a1b2c3d.partial").mkdir()
    assert _labels(cache.keep(_numbers(), [("x", 0, -1)], 64)) == list(range(64))
    assert not list(tmp_path.glob(".*.partial")), "the dead writer's partial folder is gone"
    assert (tmp_path / name / MANIFEST).is_file() and not (tmp_path / name / "junk").exists()


def test_two_writers_of_one_key_at_once_leave_one_cache(tmp_path):
    cache = Cache("disk", str(tmp_path))
    results = {}

    def build(index: int) -> None:
        results[index] = _labels(cache.keep(_numbers(2000), [("x", 0, -1)], 2000))

    threads = [threading.Thread(target=build, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0] == results[1] == list(range(2000))
    assert len(list(tmp_path.iterdir())) == 1, "one cache, no partial folder"


@pytest.mark.slow  # mounts a tmpfs
def test_a_full_disk_is_one_warning_and_the_data_goes_on_uncached(tmp_path, caplog):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    drawn = []

    def checked():  # the folder check's batches: every one drawn, the disk full or not
        for start in range(0, 200, 50):
            drawn.append(start)
            yield np.zeros([50, 32, 32, 3], np.uint8), np.arange(start, start + 50, dtype=np.int32)

    try:
        data = Cache("disk", str(disk)).keep(_numbers(200), [("x", 0, -1)], 200)  # 600 KB of pixels
        assert _labels(data) == list(range(200))
        assert data_cache.save_decoded(checked(), 32, str(disk)) is None and drawn == [0, 50, 100, 150]
        assert list(disk.iterdir()) == [], "no partial folder left"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    warnings = [record.message for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1, "one per folder in a load of the data: the check's save met the same full disk"
    assert all(warning.startswith(f"dataset.cache: could not write the cache under {disk}") for warning in warnings)
    assert all("No space left on device" in warning and "function_node" not in warning for warning in warnings)


def test_a_cache_folder_that_cannot_be_written_never_reads_decoding_into_it(tmp_path, caplog):
    """The red team's order: "Decoding N images once into the cache" came before the warning that the folder
    cannot be written, and was false. Root writes anywhere: a folder below a file cannot be made by anyone."""
    (tmp_path / "file").write_text("not a folder")
    unwritable = tmp_path / "file" / "cache"
    with caplog.at_level(logging.INFO, logger="trainer.data.cache"):
        data = Cache("disk", str(unwritable)).keep(_numbers(8), [("x", 0, -1)], 8)
    assert _labels(data) == list(range(8)), "the data goes on, uncached"
    lines = [record.getMessage() for record in caplog.records if record.name == "trainer.data.cache"]
    assert len(lines) == 1 and lines[0].startswith(f"dataset.cache: could not write the cache under {unwritable}")
    assert not any("Decoding" in line for line in lines), lines
