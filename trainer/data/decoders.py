"""Batch decoders: a batch of raw records in, (uint8 images [n, h, w, c], int32 labels [n]) out.

    python run.py dataset=cifar          # BinaryDecoder: label byte, then channel-first planes
    python run.py dataset=cats_dogs      # TFRecordDecoder: `parse_example`, then raw pixels or JPEG

Image and label come out of one parse of one record, so they cannot drift apart.
Each decoder checks the labels it parses against the number of classes (an error the
pipeline turns into one line naming the file and record); unlabeled TFRecords get -1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from trainer.data.binary import BinaryLayout
from trainer.data.decode import decode_checked
from trainer.data.record_writer import DEFAULT_KEYS, FORMATS

Decoder = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]  # a batch of records -> (uint8 images, int32 labels)
COMPRESSIONS = ("auto", "none", "gzip", "zlib")
LABEL_MAX = 2**31 - 1  # labels are saturated to int32, so one past int32 still fails the range check


Rule = tuple[tf.Tensor, Callable[[], tf.Tensor | str]]  # (per record: it breaks the rule; why: a string)


def reasons_of(rules: list[Rule] | tuple[Rule, ...]) -> tf.Tensor:
    """Per record, why it breaks the first of `rules` it breaks, else "": every string built now."""
    chosen = tf.fill(tf.shape(rules[0][0]), "")
    for bad, reason in reversed(rules):
        chosen = tf.where(bad, reason(), chosen)
    return chosen


def first_broken(*rules: Rule) -> tf.Tensor:
    """Per record, why it breaks the first of `rules` it breaks, else "". The strings are built only in a batch
    that breaks one: a good batch costs one `reduce_any` (issue 53: building them made up most of the checks'
    cost)."""
    broken = tf.stack([bad for bad, _ in rules])
    return tf.cond(tf.reduce_any(broken), lambda: reasons_of(rules), lambda: tf.fill(tf.shape(broken)[1:], ""))


def label_rule(labels: tf.Tensor, num_classes: int | None, classes: str) -> Rule:
    """The one rule of a label: in [0, num_classes) (`classes` says where that number comes from); None: any."""
    if num_classes is None:
        return tf.zeros(tf.shape(labels), tf.bool), lambda: ""
    where = classes or f"dataset.num_classes={num_classes}"
    outside = lambda: tf.strings.join(  # noqa: E731
        ["has label ", tf.strings.as_string(labels), f", expected 0 to {num_classes - 1} ({where})"]
    )
    return (labels < 0) | (labels >= num_classes), outside


def label_reason(labels: tf.Tensor, num_classes: int | None, classes: str) -> tf.Tensor:
    """Why each label breaks `label_rule` ("": it does not)."""
    return first_broken(label_rule(labels, num_classes, classes))


def assert_good(images, labels, reasons: tf.Tensor, files=None, numbers=None) -> tuple[tf.Tensor, tf.Tensor]:
    """(images, labels), asserted to hold no refused record: training's policy. The first reason stops it,
    as `FILE: record N REASON` given the batch's provenance (`trainer.data.sources.Source`); the message is
    built only then."""
    bad = reasons != ""
    any_bad = tf.reduce_any(bad)

    def refuse() -> tf.Tensor:
        at = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)  # the first bad record
        message = [reasons[at]]
        if files is not None:
            message = [files[at], ": record ", tf.strings.as_string(numbers[at]), " ", reasons[at]]
        with tf.control_dependencies([tf.debugging.Assert(~any_bad, [tf.strings.join(message)])]):
            return tf.constant(False)

    with tf.control_dependencies([tf.cond(any_bad, refuse, lambda: tf.constant(True))]):
        return tf.identity(images), tf.identity(labels)


def decode_batch(decoder: Decoder, files: tf.Tensor, numbers: tf.Tensor, records: tf.Tensor):
    """(images, labels) of a batch with its provenance, under training's policy (`assert_good`). A decoder
    that gives reasons (`checked`) has its bad record named by file and number; another raises its own error."""
    checked = getattr(decoder, "checked", None)
    if checked is None:
        return decoder(records)
    return assert_good(*checked(records), files, numbers)


def attempt(parse: Callable[[tf.Tensor], tuple], records: tf.Tensor, otherwise: Callable[[tf.Tensor], tuple]) -> tuple:
    """`parse(records)`, or `otherwise(records)` where it raises: a one-element tf.data map that drops a failure
    is the graph's only way to catch one (a record that is no protocol buffer fails its parse). `otherwise` is a
    map of a dataset read only after a failure, not a `tf.cond` branch: a branch is lowered into the caller's
    graph, and a good batch paid for walking its untaken nodes (issue 53: a large fallback's were most of the
    raw decoder's cost beyond the parse)."""
    tried = tf.data.Dataset.from_tensors(records).map(parse).ignore_errors()
    return tried.concatenate(tf.data.Dataset.from_tensors(records).map(otherwise)).take(1).get_single_element()


def attempt_each(parse: Callable[[tf.Tensor], dict], records: tf.Tensor, empty: Callable) -> tuple[dict, tf.Tensor]:
    """`parse` on the whole batch, else record by record: (each record's parse, whether it parsed);
    `empty(count)` is the parse of `count` records that did not."""

    def one(record: tf.Tensor):
        parsed, ok = attempt(lambda single: (parse(single), True), record[tf.newaxis], lambda _: (empty(1), False))
        return {key: value[0] for key, value in parsed.items()}, ok

    def each(batch: tf.Tensor):
        fields = {key: tf.TensorSpec([], value.dtype) for key, value in empty(0).items()}
        return tf.map_fn(one, batch, fn_output_signature=(fields, tf.TensorSpec([], tf.bool)))

    return attempt(lambda batch: (parse(batch), tf.fill(tf.shape(batch), True)), records, each)


@dataclass(frozen=True)
class BinaryDecoder:
    """Fixed-length records: `label_bytes` label bytes, then the pixels channel-first (R plane, G, B)."""

    layout: BinaryLayout
    num_classes: int | None = None
    classes: str = ""  # where the number of classes comes from, for the reasons ("": dataset.num_classes)

    def _raw(self, records: tf.Tensor) -> tf.Tensor:
        return tf.reshape(tf.io.decode_raw(records, tf.uint8), [-1, self.layout.record_bytes])

    def checked(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(uint8 images, int32 labels, reasons): "" for a good record, else why it is bad."""
        layout, raw = self.layout, self._raw(records)
        labels = tf.cast(raw[:, layout.label_index], tf.int32)
        planes = tf.reshape(raw[:, layout.label_bytes :], [-1, layout.channels, layout.height, layout.width])
        return tf.transpose(planes, [0, 2, 3, 1]), labels, label_reason(labels, self.num_classes, self.classes)

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return assert_good(*self.checked(records))

    def label_reasons(self, records: tf.Tensor) -> tf.Tensor:
        """Why each record of a batch is bad by its label ("": good)."""
        labels = tf.cast(self._raw(records)[:, self.layout.label_index], tf.int32)
        return label_reason(labels, self.num_classes, self.classes)

    def labels(self, records: tf.Tensor) -> tf.Tensor:
        """The labels of a batch of records alone (k-fold's stratification)."""
        labels = tf.cast(self._raw(records)[:, self.layout.label_index], tf.int32)
        return assert_good(labels, labels, self.label_reasons(records))[1]


@dataclass(frozen=True)
class RecordSpec:
    """How images are stored in the records."""

    format: str = "raw"  # raw | jpeg
    stored_size: int = 224  # raw: side of the stored square image
    image_key: str = "img_raw"
    label_key: str = "label"
    filename_key: str = "filename"
    compression: str = "auto"  # auto | none | gzip | zlib

    @classmethod
    def for_format(
        cls, format: str, stored_size: int = 224, compression: str = "auto", **keys: str | None
    ) -> RecordSpec:
        """The spec with the default keys of `format`, overridden by any non-empty `keys`."""
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}. Received: format={format}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}. Received: compression={compression}")
        chosen = {**DEFAULT_KEYS[format], **{name: key for name, key in keys.items() if key}}
        return cls(format, stored_size, chosen["image"], chosen["label"], chosen["filename"], compression)

    @property
    def raw_bytes(self) -> int:
        return self.stored_size * self.stored_size * 3


@dataclass(frozen=True)
class TFRecordDecoder:
    """`tf.train.Example` records of `spec`: parsed a batch at a time; raw pixels decoded as one tensor,
    encoded images (JPEG, PNG ...) one by one inside the batch, by the one decode (`trainer.data.decode`).
    Every rule of a record is here, once: an Example, one int64 label in [0, num_classes), one non-empty
    image string, raw pixels of stored_size² x 3 bytes, an encoded image that decodes."""

    spec: RecordSpec
    num_classes: int | None = None  # None: unlabeled records (label -1), as predict reads test sets
    labeled: bool = True
    resize_mode: str = "resize"  # how an encoded image is made square, as `serve_bytes` does (`dataset.resize_mode`)
    classes: str = ""  # where the number of classes comes from, for the reasons ("": dataset.num_classes)

    def _parse(self, records: tf.Tensor) -> tuple[dict, tf.Tensor]:
        """Each record's first image string and label and how many of each it holds, and whether it parsed."""
        spec = self.spec
        keys = {spec.image_key: tf.string, **({spec.label_key: tf.int64} if self.labeled else {})}

        def parse(batch: tf.Tensor) -> dict:
            parsed = tf.io.parse_example(batch, {key: tf.io.VarLenFeature(kind) for key, kind in keys.items()})
            found, count = {}, tf.shape(batch)[0]
            for key, values in parsed.items():
                blank = tf.zeros([count, 1], values.dtype) if values.dtype != tf.string else tf.fill([count, 1], "")
                found[key] = tf.concat([tf.sparse.to_dense(values), blank], 1)[:, 0]  # the first value, if any
                counts = tf.math.bincount(tf.cast(values.indices[:, 0], tf.int32), minlength=count)
                found[key + "#"] = counts[:count]
            return found

        def empty(count) -> dict:
            fill = {tf.string: "", tf.int64: tf.constant(0, tf.int64)}
            return {**{key: tf.fill([count], fill[kind]) for key, kind in keys.items()},
                    **{key + "#": tf.zeros([count], tf.int32) for key in keys}}  # fmt: skip

        def one_each(batch: tf.Tensor) -> dict:  # the fast parse: it fails unless every key holds one value
            parsed = tf.io.parse_example(batch, {key: tf.io.FixedLenFeature([], kind) for key, kind in keys.items()})
            ones = tf.ones(tf.shape(batch), tf.int32)
            return {**parsed, **{key + "#": ones for key in keys}}

        def fast(batch: tf.Tensor) -> tuple[dict, tf.Tensor]:
            return one_each(batch), tf.fill(tf.shape(batch), True)

        return attempt(fast, records, lambda batch: attempt_each(parse, batch, empty))

    def _labeled(self, records: tf.Tensor) -> tuple[dict, tf.Tensor, list[Rule]]:
        """(the parse, int32 labels, the rules of the record and its label) of a batch, no image decoded."""
        spec = self.spec
        parsed, parsed_ok = self._parse(records)
        kinds = f"bytes '{spec.image_key}'" + (f" and int64 '{spec.label_key}'" if self.labeled else "")
        rules = [(~parsed_ok, lambda: f"is not a tf.train.Example with {kinds}")]
        if not self.labeled:
            return parsed, -tf.ones(tf.shape(records), tf.int32), rules
        # Saturated, not wrapped: a label past int32 must still fail the range check.
        labels = tf.cast(tf.clip_by_value(parsed[spec.label_key], -1, LABEL_MAX), tf.int32)
        one_label = (parsed[spec.label_key + "#"] != 1, lambda: f"'{spec.label_key}' must hold one int64 label")
        return parsed, labels, [*rules, one_label, label_rule(labels, self.num_classes, self.classes)]

    def label_reasons(self, records: tf.Tensor) -> tf.Tensor:
        """Why each record of a batch is bad as a record or by its label ("": good), no image decoded."""
        return first_broken(*self._labeled(records)[2])

    def checked(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(uint8 images, int32 labels, reasons): "" for a good record, else why it is bad (its image black)."""
        spec = self.spec
        parsed, labels, rules = self._labeled(records)
        encoded, counts = parsed[spec.image_key], parsed[spec.image_key + "#"]
        lengths = tf.strings.length(encoded)
        one_image = f"cannot be decoded: '{spec.image_key}' must hold one non-empty byte string"
        rules.append(((counts != 1) | (lengths == 0), lambda: one_image))
        if spec.format == "raw":
            side, key = spec.stored_size, spec.image_key
            expected = f" bytes, expected {side}x{side}x3 = {spec.raw_bytes} (dataset.stored_size)"
            size = lambda: tf.strings.join(  # noqa: E731
                [f"cannot be decoded: '{key}' holds ", tf.strings.as_string(lengths), expected]
            )
            rules.append((lengths != spec.raw_bytes, size))
            pixels = lambda data: tf.reshape(tf.io.decode_raw(data, tf.uint8), [-1, side, side, 3])  # noqa: E731

            def bad_batch() -> tuple[tf.Tensor, tf.Tensor]:  # a bad record's image black
                reasons = reasons_of(rules)
                return pixels(tf.where(reasons == "", encoded, bytes(spec.raw_bytes))), reasons

            # One branch per batch, the reasons and the black images built only in a bad one (issue 53).
            broken = tf.reduce_any(tf.stack([bad for bad, _ in rules]))
            images, reasons = tf.cond(broken, bad_batch, lambda: (pixels(encoded), tf.fill(tf.shape(records), "")))
            return images, labels, reasons
        images, refused = decode_checked(encoded, spec.stored_size, self.resize_mode)  # the one decode
        undecodable = (refused != "", lambda: tf.strings.join(["cannot be decoded: ", refused]))
        return images, labels, first_broken(*rules, undecodable)

    def labels(self, records: tf.Tensor) -> tf.Tensor:
        """The labels of a batch of records alone, no image decoded (k-fold's stratification)."""
        _, labels, rules = self._labeled(records)
        return assert_good(labels, labels, first_broken(*rules))[1]

    def __call__(self, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images, labels, reasons = self.checked(records)
        return assert_good(images, labels, reasons)
