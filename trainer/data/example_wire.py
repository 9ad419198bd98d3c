"""Where a feature's value lies inside a serialized `tf.train.Example`, without reading the value.

`tf.train.Example.FromString` copies every byte of a record, pixels included. To
copy a stored image once, straight into its batch, the reader needs only where
the pixels start. This walks the protobuf wire format
(https://protobuf.dev/programming-guides/encoding/) of the few messages involved:

    Example { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
    Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }   Int64List { repeated int64 value = 1 [packed]; }

and skips over every length-delimited payload unread. `buffer` is a `FileBytes`, which
reads a file in small windows around the positions asked for. Malformed input raises `ValueError`.
"""

from __future__ import annotations

import os

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
BYTES_LIST, INT64_LIST = 1, 3  # Feature's oneof field numbers


class FileBytes:
    """A file's bytes by position, read on demand in small windows (headers, never whole records)."""

    WINDOW = 4096

    def __init__(self, fd: int):
        self.fd, self.start, self.data = fd, 0, b""

    def __getitem__(self, position: int) -> int:
        offset = position - self.start
        if not 0 <= offset < len(self.data):
            self.start, self.data, offset = position, os.pread(self.fd, self.WINDOW, position), 0
            if not self.data:
                raise ValueError(f"ends before byte {position}")
        return self.data[offset]

    def read(self, start: int, end: int) -> bytes:
        if self.start <= start and end <= self.start + len(self.data):
            return self.data[start - self.start : end - self.start]
        data = os.pread(self.fd, end - start, start)
        if len(data) != end - start:
            raise ValueError(f"ends before byte {end}")
        return data


def _varint(buffer, position: int, end: int) -> tuple[int, int]:
    """(value, position after it)."""
    value = shift = 0
    while shift < 70:
        if position >= end:
            break
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise ValueError(f"a malformed varint before byte {position}")


def fields(buffer, start: int, end: int):
    """Yields (field number, wire type, value): an int for varints, (start, end) for length-delimited fields."""
    position = start
    while position < end:
        key, position = _varint(buffer, position, end)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, position = _varint(buffer, position, end)
        elif wire == LENGTH:
            length, position = _varint(buffer, position, end)
            value, position = (position, position + length), position + length
        elif wire in (FIXED64, FIXED32):
            value, position = None, position + (8 if wire == FIXED64 else 4)
        else:
            raise ValueError(f"wire type {wire} at byte {position} (groups are not in tf.train.Example)")
        if position > end or number == 0:
            raise ValueError(f"field {number} runs past its message at byte {position}")
        yield number, wire, value


def feature_spans(buffer, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    """{key: (start, end) of its `Feature` message} of the Example in buffer[start:end]."""
    features = {}
    for number, wire, value in fields(buffer, start, end):
        if number != 1 or wire != LENGTH:
            continue  # Example.features; other fields are unknown fields, ignored as protobuf does
        for entry_number, entry_wire, entry in fields(buffer, *value):
            if entry_number != 1 or entry_wire != LENGTH:
                continue
            key, feature = b"", (entry[1], entry[1])  # a map entry's defaults: empty key, empty Feature
            for part, part_wire, span in fields(buffer, *entry):
                if part == 1 and part_wire == LENGTH:
                    key = buffer.read(*span)
                elif part == 2 and part_wire == LENGTH:
                    feature = span
            features[key] = feature  # the last entry of a repeated key wins, as in protobuf maps
    return features


def _list_spans(buffer, feature: tuple[int, int], kind: int) -> list[tuple[int, int]]:
    """The spans of the `kind` list in a Feature (several spans merge); [] if the Feature holds another kind."""
    lists, last_kind = [], None
    for number, wire, span in fields(buffer, *feature):
        if number in (1, 2, 3) and wire == LENGTH:
            if number != last_kind:
                lists = []  # a oneof: the last one set wins
            last_kind = number
            lists.append(span)
    return lists if last_kind == kind else []


def single_bytes(buffer, feature: tuple[int, int]) -> tuple[int, int]:
    """(start, end) of the one value of a bytes Feature."""
    values = [
        span
        for bytes_list in _list_spans(buffer, feature, BYTES_LIST)
        for number, wire, span in fields(buffer, *bytes_list)
        if number == 1 and wire == LENGTH
    ]
    if len(values) != 1:
        raise ValueError(f"holds {len(values)} bytes values, expected 1")
    return values[0]


def single_int64(buffer, feature: tuple[int, int]) -> int:
    """The one value of an int64 Feature (packed or not)."""
    values = []
    for int64_list in _list_spans(buffer, feature, INT64_LIST):
        for number, wire, value in fields(buffer, *int64_list):
            if number == 1 and wire == VARINT:
                values.append(value)
            elif number == 1 and wire == LENGTH:
                position, end = value
                while position < end:
                    item, position = _varint(buffer, position, end)
                    values.append(item)
    if len(values) != 1:
        raise ValueError(f"holds {len(values)} int64 values, expected 1")
    return values[0] - (1 << 64) if values[0] >= 1 << 63 else values[0]
