"""`tfrecords.numbered_batches`, the one reader of a range of a TFRecord file's records up to a broken frame:
predict and the start-up scan read whole files through it, the data check (`tfrecords.readable_rest`) the ranges
left after a data-loss error. Each record keeps its number in the file; the break is the first record that cannot
be read, exactly in an uncompressed file, "at or after" it in a compressed one."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
import tensorflow as tf

from trainer.data import record_writer, tfrecords
from trainer.data.check import UNREADABLE
from trainer.data.shares import Records
from trainer.data.sources import Source, TFRecordReader

pytestmark = pytest.mark.unit

COMPRESS = {"gzip": gzip.compress, "zlib": zlib.compress}


def _write(path: Path, count: int) -> Path:
    with record_writer.RecordFile(str(path)) as records:
        for index in range(count):
            records.write(bytes([index]) * (10 + index))
    return path


def _frame_start(data: bytes, index: int) -> int:
    offset = 0
    for _ in range(index):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    return offset


def _break_frame(path: Path, index: int) -> Path:
    """Flips a byte of record `index`'s length checksum."""
    data = bytearray(path.read_bytes())
    data[_frame_start(data, index) + 9] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _read(path: Path, start: int = 0, length: int = -1, compression: str = "", broken=tf.errors.OpError):
    """(the record numbers read, (number, exact) of the break or None)."""
    numbers = []
    try:
        for batch in tfrecords.numbered_batches(
            str(path), compression, 4, lambda numbers, _: numbers, start, length, broken
        ):
            numbers += batch.numpy().tolist()
    except tfrecords.BrokenFile as error:
        return numbers, (error.number, error.exact)
    return numbers, None


@pytest.mark.parametrize(
    ("start", "length", "expected"),
    [
        (0, -1, (list(range(7)), (7, True))),
        (2, 4, ([2, 3, 4, 5], None)),  # the range ends before the break
        (5, -1, ([5, 6], (7, True))),
        (6, 1, ([6], None)),
        (7, -1, ([], (7, True))),
    ],
)
def test_a_range_of_an_uncompressed_file_is_read_up_to_its_broken_frame_which_is_named_exactly(
    tmp_path, start, length, expected
):
    path = _break_frame(_write(tmp_path / "a.tfrecords", 12), 7)
    assert _read(path, start, length) == expected


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_a_compressed_files_break_is_the_first_record_that_cannot_be_read_at_or_after_the_damage(tmp_path, compression):
    path = _break_frame(_write(tmp_path / "a.tfrecords", 12), 7)
    path.write_bytes(COMPRESS[compression](path.read_bytes()))  # the broken frame inside a whole compressed stream
    kind = tfrecords.TF_COMPRESSION[compression]
    assert _read(path, compression=kind) == (list(range(7)), (7, False))
    assert _read(path, 3, 2, compression=kind) == ([3, 4], None)


def test_an_uncompressed_file_cut_inside_a_frame_header_is_broken_there_though_tensorflow_reads_no_error(tmp_path):
    path = _write(tmp_path / "cut.tfrecords", 8)
    data = path.read_bytes()
    path.write_bytes(data[: _frame_start(data, 5) + 5])  # 5 of record 5's 12 header bytes
    assert sum(1 for _ in tf.data.TFRecordDataset(str(path))) == 5, "TensorFlow ends the read quietly"
    assert _read(path) == (list(range(5)), (5, True))


def test_the_data_check_lists_each_broken_frame_and_counts_the_readable_records_of_every_range(tmp_path):
    """After the record read last (file a, record 2): a's records 3-6 and its frame 7, then b whole, whose frame
    is cut inside its header (which no read error tells: the check missed it), then c whole."""
    a = _break_frame(_write(tmp_path / "a.tfrecords", 12), 7)
    b = _write(tmp_path / "b.tfrecords", 8)
    b.write_bytes(b.read_bytes()[: _frame_start(b.read_bytes(), 5) + 5])
    c = _write(tmp_path / "c.tfrecords", 3)
    files = [str(a), str(b), str(c)]
    source = Source(Records.whole_files(files, 12 + 5 + 3), TFRecordReader(""))
    rest = list(tfrecords.readable_rest(source, (str(a), 2)))
    assert [readable.records.ranges for readable, _ in rest] == [
        ((str(a), 3, 4),),
        ((str(b), 0, 5),),
        ((str(c), 0, 3),),
    ]
    assert [broken for _, broken in rest] == [
        {"file": f"{a}: record 7", "record": 7, "reason": UNREADABLE},
        {"file": f"{b}: record 5", "record": 5, "reason": UNREADABLE},
        None,
    ]


def test_only_a_data_loss_error_is_a_broken_frame_to_the_data_check(tmp_path):
    """Another read error (here a file gone since the check started) is the pipeline's error, not a bad record;
    predict's reader takes any read error as the file's end."""
    missing = str(tmp_path / "gone.tfrecords")
    with pytest.raises(tf.errors.NotFoundError):
        list(tfrecords.readable_rest(Source(Records.whole_files([missing], 1), TFRecordReader("")), None))
    assert _read(Path(missing)) == ([], (0, True))
