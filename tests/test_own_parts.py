"""`dataset=custom`: a part of your own whose decoder offers `checked(records)` gets the built-in formats'
provenance: its bad records are named by file and record through the one pipeline (docs/extending.md)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from conftest import compose
from trainer.config.store import to_settings
from trainer.data.decoders import assert_good
from trainer.data.parts import Splits
from trainer.data.shares import Records
from trainer.data.sources import Source
from trainer.errors import DataError
from trainer.tasks.data import load_data

pytestmark = pytest.mark.integration


class CheckedStripes:
    """Record `i` is its "file" name's first character: the label's digit, or `x` (no label: a bad record).
    The part is its own decoder, with `checked`: a reason per record instead of an error."""

    class Reader:
        parallel = False

        def read(self, path, start, length):
            return tf.data.Dataset.from_tensors(tf.strings.substr(path, 0, 1)).take(length)

    def __init__(self, image_size: int, names: str = "0,1,x,1,0,1,0,1", **_: object) -> None:
        self.size, self.names = image_size, [f"{first}-{index}" for index, first in enumerate(names.split(","))]

    def checked(self, records):
        good = tf.strings.regex_full_match(records, "[0-9]")
        labels = tf.strings.to_number(tf.where(good, records, "0"), tf.int32)
        rows = tf.one_hot(labels * (self.size // 2), self.size, dtype=tf.uint8) * 255
        images = tf.tile(rows[:, :, None, None], [1, 1, self.size, 3])
        return images, labels, tf.where(good, "", "holds no label digit")

    def __call__(self, records):
        return assert_good(*self.checked(records))

    def load(self, check_val: bool = True) -> Splits:
        source = Source(Records.whole_files(self.names, len(self.names)), self.Reader())
        fingerprint = {split: {"records": len(self.names)} for split in ("train", "val", "test")}
        files = lambda: (self.names, [1] * len(self.names))  # noqa: E731
        return Splits(dict.fromkeys(("train", "val", "test"), source), self, ["top", "middle"], files,
                      fingerprint=fingerprint, files=[])  # fmt: skip


class TwoValueChecked(CheckedStripes):
    def checked(self, records):
        return super().checked(records)[:2]


def _load(name: str = "CheckedStripes"):
    overrides = ["dataset=custom", f"dataset._target_=test_own_parts.{name}", "debug=smoke"]
    return load_data(to_settings(compose(overrides)).dataset, 4, 0)


def test_a_custom_decoder_s_bad_record_is_named_by_the_pipeline_and_listed_by_the_check():
    """The start-up check decoded the first batch by calling the decoder, so a part whose first batch held one
    bad record failed there ('its decoder failed on the first batch', no record named). It checks through
    `checked` now: training names the record from its provenance, and the data check's pipeline lists it."""
    data = _load()
    with pytest.raises(DataError, match=r"^bad input data: x-2: record 0 holds no label digit$"):
        with data.named_bad_records():
            for _ in data.split("train"):
                pass
    reasons = [
        (file.decode(), reason.decode())
        for _, _, batch_reasons, files, _ in data.checked("train")
        for file, reason in zip(files.numpy(), batch_reasons.numpy(), strict=True)
        if reason
    ]
    assert reasons == [("x-2", "holds no label digit")]


def test_a_checked_that_breaks_its_contract_is_one_line_at_start_up():
    with pytest.raises(
        DataError, match=r"TwoValueChecked: its decoder's checked\(\) gives 2 values; expected \(images"
    ):
        _load("TwoValueChecked")
