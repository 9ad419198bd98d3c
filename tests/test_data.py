"""The input pipeline on binary records: alignment, channel order, determinism, per-image randomness, bad files."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from conftest import compose, pattern_records, write_cifar
from trainer.config import to_settings
from trainer.data import binary, pipeline
from trainer.data.augmentation import Augmentation
from trainer.data.cache import Cache
from trainer.data.decoders import BinaryDecoder
from trainer.data.formats.binary import check_labels
from trainer.data.preprocess import Preprocess, augment_batch, prepare_images
from trainer.data.shares import Records, ranges_of
from trainer.data.sources import FixedLengthReader, Source
from trainer.errors import DataError
from trainer.models.preprocessing import augmentation_layers
from trainer.tasks.data import load_data

pytestmark = pytest.mark.unit

CIFAR = binary.BinaryLayout(32, 32, 3)
DECODE = BinaryDecoder(CIFAR, num_classes=10)
RAW = Preprocess(image_size=32)  # no resize: pixels stay exact


def _files(folder) -> list[str]:
    return [str(folder / f"data_batch_{i}.bin") for i in range(1, 6)]


def _all_records(folder) -> Source:
    return Source(Records.whole_files(_files(folder), 80), FixedLengthReader(CIFAR.record_bytes))


def _prepare(raw, layout, preprocess, seed=None):
    """A batch of raw records as the training pipeline prepares it: decoded, then resized and cropped."""
    images, labels = BinaryDecoder(layout)(raw)
    return prepare_images(images, preprocess, seed), labels


def _labels_and_indexes(images, labels):
    images, labels = np.asarray(images, dtype=np.float64), np.asarray(labels)
    encoded_label = np.rint(images[:, 5, 5, 0] / 20).astype(int)
    index = np.rint(images[:, 5, 5, 1] + 256 * images[:, 5, 5, 2]).astype(int)
    return encoded_label, labels, index


def test_channel_first_decode_matches_known_pattern():
    # One 2x2 RGB image stored as R plane, G plane, B plane.
    planes = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    record = tf.constant([bytes([7]) + planes.tobytes()])
    images, labels = BinaryDecoder(binary.BinaryLayout(2, 2, 3))(record)
    assert labels.numpy().tolist() == [7]
    np.testing.assert_array_equal(images.numpy()[0], planes.transpose(1, 2, 0))
    assert images.numpy()[0, 0, 1].tolist() == [1, 5, 9]  # R, G, B of the pixel at row 0, column 1


@pytest.mark.parametrize("augment", [Augmentation(), Augmentation(crop="random", crop_size=28)])
def test_every_image_keeps_its_label_through_shuffle_parallel_map_and_batching(tmp_path, augment):
    folder = write_cifar(tmp_path, records_per_file=16)
    preprocess = Preprocess(image_size=32, augment=augment)
    dataset = pipeline.train_dataset(_all_records(folder), DECODE, preprocess, batch_size=8, seed=3, shuffle_buffer=80)
    seen = []
    for images, labels in dataset.take(10):  # one full pass: 80 records
        encoded, actual, index = _labels_and_indexes(images, labels)
        np.testing.assert_array_equal(encoded, actual)
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(80)), "one epoch must hold every record exactly once"
    assert seen != list(range(80)), "the records must be shuffled"


def test_eval_pipeline_keeps_file_order(tmp_path):
    folder = write_cifar(tmp_path, records_per_file=16)
    ranges = ranges_of(_files(folder), [16] * 5, 70, 80)  # the last 10 records: a byte range of the last file
    source = Source(Records(ranges, 10), FixedLengthReader(CIFAR.record_bytes))
    batches = list(pipeline.eval_dataset(source, DECODE, RAW, batch_size=4))
    assert [len(labels) for _, labels in batches] == [4, 4, 2]
    index = np.concatenate([_labels_and_indexes(images, labels)[2] for images, labels in batches])
    assert index.tolist() == list(range(70, 80))


def test_same_seed_same_batches_and_other_seed_other_batches(tmp_path):
    folder = write_cifar(tmp_path)
    preprocess = Preprocess(32, Augmentation(crop="random", crop_size=28))

    def first_batches(seed):
        dataset = pipeline.train_dataset(_all_records(folder), DECODE, preprocess, 8, seed, 80)
        return [images.numpy() for images, _ in dataset.take(12)]  # crosses into the second epoch

    run_a, run_b, other = first_batches(5), first_batches(5), first_batches(6)
    for batch_a, batch_b in zip(run_a, run_b, strict=False):
        np.testing.assert_array_equal(batch_a, batch_b)
    assert not np.array_equal(run_a[0], other[0])
    assert not np.array_equal(run_a[0], run_a[10]), "the second epoch must be reshuffled and re-augmented"


def test_iterators_made_before_training_do_not_change_what_training_reads(tmp_path):
    """Keras, a strategy or a report may open the training data before `fit` does: the batches training
    reads must not depend on how many iterators were made of the dataset before."""
    folder = write_cifar(tmp_path, records_per_file=16)
    preprocess = Preprocess(32, Augmentation(crop="random", crop_size=28))
    for cache in (None, Cache("memory"), Cache("disk", str(tmp_path / "cache"))):
        dataset = pipeline.train_dataset(_all_records(folder), DECODE, preprocess, 8, 5, 80, cache=cache)
        peeked = [labels.numpy() for _, labels in dataset.take(3)]
        for _ in range(2):
            next(iter(dataset))
        again = [labels.numpy() for _, labels in dataset.take(12)]  # crosses into the second pass
        np.testing.assert_array_equal(np.stack(peeked), np.stack(again[:3]))
        assert not np.array_equal(again[0], again[10]), "each pass still gets its own order"


def _offsets(images: np.ndarray) -> list[tuple[int, int]]:
    """Where each crop came from, for images whose pixel (y, x) holds y * 64 + x."""
    return [(int(image[0, 0, 0]) // 64, int(image[0, 0, 0]) % 64) for image in images]


def test_random_parameters_are_drawn_per_image():
    grid = (np.arange(32)[:, None] * 64 + np.arange(32)[None, :]).astype(np.float32)
    images = tf.constant(np.repeat(grid[None, :, :, None], 256, axis=0).repeat(3, axis=-1))
    cropped = augment_batch(images, Augmentation(crop="random", crop_size=28), tf.constant(11, tf.int64)).numpy()
    offsets = _offsets(cropped)
    assert len(set(offsets)) > 10, "images in one batch must get different crops"
    tops, lefts = zip(*offsets, strict=False)
    assert set(tops) == set(range(5)) and set(lefts) == set(range(5)), "every offset 0..4 must occur"
    # Each crop is an exact window of the original.
    for image, (top, left) in zip(cropped, offsets, strict=False):
        np.testing.assert_array_equal(image[..., 0], grid[top : top + 28, left : left + 28])


def test_preprocess_is_the_same_eagerly_and_inside_dataset_map(tmp_path):
    folder = write_cifar(tmp_path)
    raw = tf.constant([(folder / "test_batch.bin").read_bytes()[i * 3073 : (i + 1) * 3073] for i in range(8)])
    preprocess = Preprocess(32, Augmentation(crop="random", crop_size=28))
    seed = tf.constant(9, tf.int64)
    eager, _ = _prepare(raw, CIFAR, preprocess, seed)
    mapped = tf.data.Dataset.from_tensors((raw, seed)).map(lambda r, s: _prepare(r, CIFAR, preprocess, s))
    np.testing.assert_array_equal(next(iter(mapped))[0].numpy(), eager.numpy())
    assert eager.dtype == tf.uint8 and eager.shape == (8, 28, 28, 3), "the host yields the model's uint8 inputs"
    resized = prepare_images(tf.constant(np.full((2, 20, 20, 3), 200, np.uint8)), Preprocess(32))
    assert resized.dtype == tf.uint8 and np.all(resized.numpy() == 200), "a resize rounds back to exact uint8"


def test_grayscale_records_are_resized_to_three_channels():
    record = tf.constant([bytes([3]) + bytes(range(64))])
    images, labels = _prepare(record, binary.BinaryLayout(8, 8, 1), Preprocess(32))
    assert images.shape == (1, 32, 32, 3) and labels.numpy().tolist() == [3]
    np.testing.assert_array_equal(images[..., 0].numpy(), images[..., 2].numpy())


@pytest.mark.parametrize(
    "content, message",
    [
        (pattern_records(np.array([1, 2])) + b"\x00" * 10, "not a whole number of 3073-byte records"),
        (b"", "the file is empty, expected 3073-byte records"),
        (pattern_records(np.array([1, 10, 3])), "record 1 has label 10, expected 0 to 9 (dataset.num_classes=10)"),
    ],
    ids=["truncated", "zero-byte", "label-out-of-range"],
)
def test_bad_files_fail_naming_the_file(tmp_path, content, message):
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"data_batch_1\.bin") as error:
        check_labels([path], BinaryDecoder(CIFAR, num_classes=10))
    assert message in str(error.value)


def test_missing_files_list_what_was_expected_and_where(tmp_path):
    with pytest.raises(DataError) as error:
        binary.locate(str(tmp_path), ["data_batch_1.bin", "test_batch.bin"], ["cifar-10-batches-bin"])
    assert "data_batch_1.bin, test_batch.bin not found in" in str(error.value)
    assert "cifar-10-batches-bin" in str(error.value) and "dataset.download=true" in str(error.value)


def test_files_are_found_in_the_folder_the_tarball_extracts_to(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-bin")
    paths = binary.locate(str(tmp_path), ["data_batch_1.bin"], ["cifar-10-batches-bin"])
    assert paths == [tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin"]


def test_splits_hold_out_the_end_of_the_training_files(tmp_path):
    folder = write_cifar(tmp_path)
    train = [folder / f"data_batch_{i}.bin" for i in range(1, 6)]
    splits = binary.make_splits(train, [folder / "test_batch.bin"], CIFAR, 10, val_size=16, val_source="train")
    # Records [0, 64) for training, [64, 80) for validation: the first four files, then the whole fifth.
    assert splits["train"].count == 64 and splits["train"].ranges == tuple((str(f), 0, 16) for f in train[:4])
    assert splits["val"].count == 16 and splits["val"].ranges == ((str(train[4]), 0, 16),)
    assert splits["test"].count == 16
    with pytest.raises(DataError, match="dataset.val_size=80"):
        binary.make_splits(train, [folder / "test_batch.bin"], CIFAR, 10, val_size=80, val_source="train")


def test_the_decoded_cache_gives_the_same_batches_in_memory_and_on_disk(tmp_path):
    folder = write_cifar(tmp_path)
    preprocess = Preprocess(32, Augmentation(crop="random", crop_size=28))
    caches = [None, Cache("memory"), Cache("disk", str(tmp_path / "cache")), Cache("disk", str(tmp_path / "cache"))]
    batches = []
    for cache in caches:  # the second disk cache reads what the first wrote
        dataset = pipeline.train_dataset(_all_records(folder), DECODE, preprocess, 8, 4, 80, cache=cache)
        batches.append([(images.numpy(), labels.numpy()) for images, labels in dataset.take(12)])
    assert len(list((tmp_path / "cache").iterdir())) == 1, "one key, written once"
    for other in batches[1:]:
        for (images_a, labels_a), (images_b, labels_b) in zip(batches[0], other, strict=True):
            np.testing.assert_array_equal(labels_a, labels_b)
            np.testing.assert_array_equal(images_a, images_b)  # augmentation after the cache: the same crops
    evaluation = [
        np.concatenate(
            [i.numpy() for i, _ in pipeline.eval_dataset(_all_records(folder), DECODE, preprocess, 16, cache=c)]
        )
        for c in caches
    ]
    for other in evaluation[1:]:
        np.testing.assert_array_equal(evaluation[0], other)  # and in order


def test_parameter_distributions_match_the_per_example_recipe():
    """Over many images, our batch-level draws follow the same distributions as tf.image's per-image ops."""
    count = 2048
    grid = (np.arange(32)[:, None] * 64 + np.arange(32)[None, :]).astype(np.float32)
    images = tf.constant(np.repeat(grid[None, :, :, None], count, axis=0).repeat(3, axis=-1))
    cropped = augment_batch(images, Augmentation(crop="random", crop_size=28), tf.constant(3, tf.int64))
    (flip,) = augmentation_layers(Augmentation(flip=True), seed=3)  # the flip is the model's first layer
    ours = np.asarray(flip(tf.cast(cropped, tf.float32), training=True))
    tf.random.set_seed(0)
    recipe = np.stack(
        [tf.image.random_flip_left_right(tf.image.random_crop(image, [28, 28, 3])).numpy() for image in images[:512]]
    )

    def offsets_and_flips(batch):
        corner = np.minimum(batch[:, 0, 0, 0], batch[:, 0, -1, 0]).astype(int)
        flipped = batch[:, 0, 0, 0] > batch[:, 0, -1, 0]
        return corner // 64, corner % 64, flipped

    for ours_values, recipe_values in zip(offsets_and_flips(ours), offsets_and_flips(recipe), strict=True):
        ours_share = np.bincount(ours_values.astype(int), minlength=5) / len(ours_values)
        recipe_share = np.bincount(recipe_values.astype(int), minlength=5) / len(recipe_values)
        np.testing.assert_allclose(ours_share, recipe_share, atol=0.07)


def test_each_split_pipeline_is_built_when_first_read_and_once(monkeypatch):
    """`mode=evaluate` builds no training pipeline, and training's first step waits for none it reads later."""
    built = []
    for name in ("train_dataset", "eval_dataset"):
        original = getattr(pipeline, name)
        monkeypatch.setattr(pipeline, name, lambda *a, _f=original, _n=name, **k: built.append(_n) or _f(*a, **k))
    data = load_data(to_settings(compose(["debug=smoke"])).dataset, 16, 0)
    assert built == [], "nothing is built before it is read"
    assert data.split("test") is data.split("test") and built == ["eval_dataset"]
    assert data.train() is data.train() and built == ["eval_dataset", "train_dataset"]
    images, labels = next(iter(data.split("test")))
    assert images.dtype == tf.uint8 and images.shape[1:] == (32, 32, 3) and labels.shape == (16,)
