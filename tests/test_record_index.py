"""The indexed raw-TFRecord reader: the same pixels and labels as TensorFlow's parser, and every fault named."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from trainer.data import tfrecords
from trainer.data.record_index import RecordIndex
from trainer.errors import DataError

SIZE = 6
SPEC = tfrecords.RecordSpec.for_format("raw", SIZE)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _hand_made(entries: list[tuple[bytes, bytes]], trailing_unknown: bool = False) -> bytes:
    """An Example written field by field: `entries` of (key, serialized Feature), in this order."""
    features = b"".join(_field(1, _field(1, key) + _field(2, feature)) for key, feature in entries)
    return _field(1, features) + (_varint(7 << 3 | 0) + _varint(99) if trailing_unknown else b"")


def _pixels(index: int) -> bytes:
    return np.full((SIZE, SIZE, 3), index, np.uint8).tobytes()


def _examples() -> list[bytes]:
    """Layouts a writer may produce: keys in either order, extra features, unpacked and packed int64,
    multi-byte and negative varints, unknown fields."""
    unpacked = _field(3, _varint(1 << 3 | 0) + _varint(300))  # Int64List.value not packed
    packed = _field(3, _field(1, _varint(5)))
    return [
        tfrecords.make_example(SPEC, _pixels(0), 1, None, SIZE, SIZE),
        tfrecords.make_example(SPEC, _pixels(1), 127, None, SIZE, SIZE),
        tf.train.Example(
            features=tf.train.Features(
                feature={
                    "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[SIZE])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1 << 40])),
                    "img_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_pixels(2)])),
                    "filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x.jpg"])),
                }
            )
        ).SerializeToString(),
        _hand_made([(b"img_raw", _field(1, _field(1, _pixels(3)))), (b"label", unpacked)], trailing_unknown=True),
        _hand_made([(b"label", packed), (b"img_raw", _field(1, _field(1, _pixels(4))))]),
        tfrecords.make_example(SPEC, _pixels(5), -3, None, SIZE, SIZE),
    ]


def _write(path, records: list[bytes]) -> str:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def test_the_index_reads_what_tensorflow_parses(tmp_path):
    records = _examples()
    files = [_write(tmp_path / "a.tfrecords", records[:4]), _write(tmp_path / "b.tfrecords", records[4:])]
    index = RecordIndex.build(files, "img_raw", "label", SPEC.raw_bytes, labeled=True)
    assert len(index) == len(records) and index.first.tolist() == [0, 4, 6]

    parsed = tf.io.parse_example(
        records,
        {"img_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)},
    )
    expected_images = tf.io.decode_raw(parsed["img_raw"], tf.uint8).numpy()
    order = np.array([5, 0, 3, 3, 4, 1, 2])  # any order, repeats too
    images, labels = index.read(order)
    np.testing.assert_array_equal(images, expected_images[order])
    assert labels.dtype == np.int32
    assert labels.tolist() == [-1, 1, 300, 300, 5, 127, 2**31 - 1], "saturated to [-1, 2**31 - 1], never wrapped"
    np.testing.assert_array_equal(labels, np.clip(parsed["label"].numpy(), -1, 2**31 - 1)[order])
    tf_labels = tfrecords.image_batches(tf.data.Dataset.from_tensor_slices(records), SPEC, True, 8)
    assert next(iter(tf_labels))[1].numpy()[order].tolist() == labels.tolist(), "both readers saturate alike"

    # Through tf.data: static shapes, the order of the ids, the label of each image's own record.
    batches = index.batches(tf.data.Dataset.from_tensor_slices(order).batch(4, drop_remainder=True), SIZE, SIZE)
    assert batches.element_spec[0].shape.as_list() == [4, SIZE, SIZE, 3]
    (batch_images, batch_labels) = next(iter(batches))
    np.testing.assert_array_equal(batch_images.numpy().reshape(4, -1), expected_images[order[:4]])
    np.testing.assert_array_equal(batch_labels.numpy(), labels[:4])

    unlabeled = RecordIndex.build(files, "img_raw", "no_such_key", SPEC.raw_bytes, labeled=False)
    assert unlabeled.read(np.arange(6))[1].tolist() == [-1] * 6


def _good(tmp_path) -> str:
    records = [tfrecords.make_example(SPEC, _pixels(i), 0, None, SIZE, SIZE) for i in range(4)]
    return _write(tmp_path / "good.tfrecords", records)


@pytest.mark.parametrize(
    "case, message",
    [
        ("truncated", "record 3 is cut short"),
        ("length", "record 2: its length fails its checksum"),
        ("garbage", "record 1 is not a readable tf.train.Example"),
        ("missing_image", "record 1 has no 'img_raw' feature; keys: ['label']"),
        ("missing_label", "record 1 has no 'label' feature"),
        ("wrong_size", "record 1: 'img_raw' holds 12 bytes, expected 108"),
        ("two_images", "record 1: 'img_raw' holds 2 bytes values, expected 1"),
        ("label_as_bytes", "record 1: 'label' holds 0 int64 values, expected 1"),
    ],
)
def test_bad_records_are_named_at_start_up(tmp_path, case, message):
    good = _good(tmp_path)
    path = tmp_path / "bad.tfrecords"
    data = bytearray(open(good, "rb").read())
    record = len(data) // 4
    second = {
        "garbage": b"\xff\xff\xff",
        "missing_image": _hand_made([(b"label", _field(3, _field(1, _varint(1))))]),
        "missing_label": _hand_made([(b"img_raw", _field(1, _field(1, _pixels(1))))]),
        "wrong_size": tfrecords.make_example(SPEC, bytes(12), 0, None, 2, 2),
        "two_images": _hand_made([(b"img_raw", _field(1, _field(1, _pixels(1)) + _field(1, _pixels(1))))]),
        "label_as_bytes": _hand_made(
            [(b"img_raw", _field(1, _field(1, _pixels(1)))), (b"label", _field(1, _field(1, b"1")))]
        ),
    }
    if case == "truncated":
        path.write_bytes(data[:-3])
    elif case == "length":
        data[2 * record] ^= 0x01
        path.write_bytes(data)
    else:
        _write(path, [tfrecords.make_example(SPEC, _pixels(0), 0, None, 6, 6), second[case]])
    with pytest.raises(DataError, match=re.escape(message)) as error:
        RecordIndex.build([good, str(path)], "img_raw", "label", SPEC.raw_bytes, labeled=True)
    assert str(error.value).startswith(str(path))


def test_without_preadv_a_seek_and_readv_read_the_same(tmp_path, monkeypatch):
    """macOS has no `os.preadv`."""
    path = _good(tmp_path)
    index = RecordIndex.build([path], "img_raw", "label", SPEC.raw_bytes, labeled=True)
    expected = index.read(np.array([3, 0, 2]))
    monkeypatch.delattr(os, "preadv")
    got = index.read(np.array([3, 0, 2]))
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[0][0, 0] == 3


def test_a_record_changed_after_start_up_is_named_when_read(tmp_path):
    path = _good(tmp_path)
    index = RecordIndex.build([path], "img_raw", "label", SPEC.raw_bytes, labeled=True)
    data = bytearray(open(path, "rb").read())
    data[int(index.pixels[2]) + 7] ^= 0x10  # one pixel bit of record 2
    open(path, "wb").write(data)
    index.read(np.array([0, 1, 3]))
    with pytest.raises(ValueError, match=f"{path}: record 2 fails its checksum"):
        index.read(np.array([1, 2]))
    os.truncate(path, int(index.end[1]))
    with pytest.raises(ValueError, match="record 1 is cut short: the file changed after start-up"):
        index.read(np.array([1]))
    os.remove(path)
    with pytest.raises(ValueError, match=f"{path}: cannot be read any more"):
        index.read(np.array([0]))


def test_which_files_the_index_reads():
    files = ["/data/a.tfrecords"]
    assert tfrecords.indexed(SPEC, files)
    assert not tfrecords.indexed(SPEC, ["gs://bucket/a.tfrecords"]), "remote files: TFRecordDataset"
    assert not tfrecords.indexed(tfrecords.RecordSpec.for_format("jpeg", SIZE), files), "JPEGs: TFRecordDataset"


def test_the_index_is_built_once_while_the_files_are_unchanged(tmp_path):
    path = _good(tmp_path)
    first = tfrecords._index([path], SPEC, labeled=True)
    assert tfrecords._index([path], SPEC, labeled=True) is first, "the training reader and train_plain share it"
    _write(path, [tfrecords.make_example(SPEC, _pixels(i), 1, None, SIZE, SIZE) for i in range(5)])
    assert len(tfrecords._index([path], SPEC, labeled=True)) == 5, "a changed file is indexed again"
