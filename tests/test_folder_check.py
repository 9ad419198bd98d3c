"""`dataset=folder`'s start-up check decodes each photo once: its verdicts are kept across runs (and trials of a
sweep), a changed file is decoded again, and a split standing in for another is checked once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from test_folder import _settings, make_folder

from trainer.data import verdicts
from trainer.data.formats.folder import ImageFolder
from trainer.errors import DataError


def _load(root: Path, **options):
    return ImageFolder(data_dir=str(root), image_size=32, **options).load()


@pytest.mark.unit
def test_a_second_check_decodes_nothing_and_a_changed_file_is_decoded_again(tmp_path, decoded):
    root = make_folder(tmp_path / "photos", "tree", per_class=4)
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    options = {"val_fraction": 0.25, "test_fraction": 0.25}
    first = _load(root, **options)
    assert len(decoded) == 9 and len(set(decoded)) == 9, "the first run decodes every file once"
    assert [entry["file"] for entry in first.skipped] == ["cat/broken.jpg"]

    decoded.clear()
    second = _load(root, **options)
    assert decoded == [], "a second run decodes nothing"
    assert second.skipped == first.skipped and second.fingerprint == first.fingerprint

    grown, touched = root / "dog" / "1.jpg", root / "cat" / "2.png"
    grown.write_bytes(grown.read_bytes() + b"\0")  # another size
    status = touched.stat()
    os.utime(touched, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))  # same size, another time
    decoded.clear()
    _load(root, **options)
    assert sorted(decoded) == sorted([str(grown), str(touched)]), "a changed file is decoded again, only it"

    decoded.clear()
    _load(root, **options, resize_mode="crop")
    assert len(decoded) == 9, "another resize mode is another check"


@pytest.mark.unit
def test_a_half_written_or_foreign_verdict_file_is_not_trusted(tmp_path, decoded):
    root = make_folder(tmp_path / "photos", "tree", per_class=2)
    _load(root, val_fraction=0.5)
    (kept,) = verdicts.folder().glob("*.json")
    kept.write_text(kept.read_text()[:40])  # as a writer killed mid-write would leave it, were it not renamed
    decoded.clear()
    _load(root, val_fraction=0.5)
    assert len(decoded) == 4, "an unreadable verdict file is no verdict: every file decoded again"
    assert list(verdicts.folder().glob(".*")) == [], "the writer's temporary file is gone once renamed"


@pytest.mark.unit
def test_without_a_test_split_the_validation_split_is_decoded_once(tmp_path, decoded):
    root = make_folder(tmp_path / "photos", "splits", per_class=2)
    for path in sorted((root / "test").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (root / "test").rmdir()
    splits = _load(root)
    assert splits.sources["test"].count == splits.sources["val"].count == 4
    assert len(decoded) == 8 and len(set(decoded)) == 8, "train and val each decoded once, val not again as test"


@pytest.mark.unit
def test_a_refused_folder_leaves_no_pixels_in_the_cache(tmp_path, decoded):
    root = make_folder(tmp_path / "photos", "tree", per_class=2)
    for path in (root / "dog").iterdir():
        path.write_bytes(b"not an image")
    with pytest.raises(DataError, match="class 'dog' has no training image"):
        _load(root, val_fraction=0.5, cache="disk", cache_dir=str(tmp_path / "decoded"))
    assert list((tmp_path / "decoded").iterdir()) == [], "the check's saved pixels go with the refusal"


@pytest.fixture
def decodes(monkeypatch, tmp_path):
    """Every image the one decode decodes, counted in the graph (`trainer.data.decode._decode_one` wrapped; the
    traced decoders traced again with it, and once more afterwards without it)."""
    import tensorflow as tf

    from trainer.data import decode

    count, original = [0], decode._decode_one

    def tick():
        count[0] += 1
        return np.int64(count[0])

    def counted(data, *arguments, **options):
        image = original(data, *arguments, **options)
        with tf.control_dependencies([tf.numpy_function(tick, [], tf.int64, stateful=True)]):
            return tf.identity(image)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(decode, "_decode_one", counted)
    decode._batch_decoder.cache_clear()
    decode._image_decoder.cache_clear()
    yield count
    decode._batch_decoder.cache_clear()
    decode._image_decoder.cache_clear()


@pytest.mark.integration
def test_two_runs_with_a_disk_cache_decode_each_photo_once_the_check_filling_the_cache(tmp_path, decodes):
    """The start-up check's decode is the cache's: its pixels are saved as the entries the pipeline keys, so the
    first epoch, the validation pass and the test evaluation read them, and a second run decodes nothing. Before,
    the check decoded every photo and the first pass decoded each again (`python -m benchmarks --only
    folder_search_decodes` counts a whole search)."""
    from trainer.tasks.data import load_data

    root = make_folder(tmp_path / "photos", "splits", per_class=2)  # 4 photos in each of train, val and test
    cache = [f"dataset.cache_dir={tmp_path / 'decoded'}", "dataset.cache=disk"]
    for run in (1, 2):
        data = load_data(_settings(root, *cache).dataset, batch_size=4, seed=0)
        passes = (data.train().take(data.train_steps), data.split("val"), data.split("test"))
        assert [sum(len(labels) for _, labels in split) for split in passes] == [4, 4, 4], f"run {run}"
    assert decodes[0] == 12, "each of the 12 photos decoded once over both runs"


@pytest.mark.integration
def test_in_memory_the_first_epoch_reads_the_checks_pixels(tmp_path, decodes):
    """`dataset.cache=memory` (auto's choice for a small folder): within one run the check's pixels are the
    memory cache's, so the first epoch and the validation pass decode no photo again (the test split, not kept in
    memory, is decoded when evaluated)."""
    from trainer.tasks.data import load_data

    root = make_folder(tmp_path / "photos", "splits", per_class=2)  # 4 photos in each of train, val and test
    data = load_data(_settings(root, "dataset.cache=memory").dataset, batch_size=4, seed=0)
    for _ in range(2):
        passes = (data.train().take(data.train_steps), data.split("val"))
        assert [sum(len(labels) for _, labels in split) for split in passes] == [4, 4]
    assert decodes[0] == 12, "each photo decoded once, by the check"
