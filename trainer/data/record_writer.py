"""Writes `tf.train.Example` TFRecord files without importing TensorFlow (the converter's worker processes).

    python -m trainer.convert PetImages/ records/ --workers 2 --compression gzip

`encode_example` gives exactly the bytes of
`tf.train.Example(...).SerializeToString(deterministic=True)` (map entries sorted by
key; tests/test_convert.py checks it against protobuf), so the output is the same
whatever process writes it. `RecordFile` frames records as TFRecord does (length,
masked CRC32C of the length, data, masked CRC32C of the data) and can compress the
whole stream as GZIP or ZLIB, which `TFRecordDataset(compression_type=...)` reads.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import crc32c

FORMATS = ("raw", "jpeg")
DEFAULT_KEYS = {  # shared with the reader (trainer.data.tfrecords)
    "raw": {"image": "img_raw", "label": "label", "filename": "filename"},
    "jpeg": {"image": "image/encoded", "label": "image/class/label", "filename": "image/filename"},
}
COMPRESSIONS = ("none", "gzip", "zlib")


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten bytes of two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))  # Feature.bytes_list { value }


def int64_feature(value: int) -> bytes:
    return _field(3, _field(1, _varint(value)))  # Feature.int64_list { value } (packed)


def encode_example(features: dict[str, bytes]) -> bytes:
    """A serialized Example from {key: encoded Feature}, entries in key order (deterministic)."""
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, feature)) for key, feature in sorted(features.items())
    )
    return _field(1, entries)


def example_features(
    format: str,
    keys: dict[str, str],
    image: bytes,
    label: int | None,
    filename: bytes | None,
    height: int,
    width: int,
) -> dict[str, bytes]:
    """The features of one image record. A labeled raw record holds exactly `label` and `img_raw`,
    as the classic recipe does; JPEG records carry the TFDS / Model Garden keys."""
    features = {keys["image"]: bytes_feature(image)}
    if label is not None:
        features[keys["label"]] = int64_feature(label)
    if format == "jpeg":
        features["image/height"] = int64_feature(height)
        features["image/width"] = int64_feature(width)
        features["image/format"] = bytes_feature(b"jpeg")
    if filename is not None and (format == "jpeg" or label is None):
        features[keys["filename"]] = bytes_feature(filename)
    return features


def masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class RecordFile:
    """A TFRecord file being written; `compression` is none, gzip or zlib. Use as a context manager."""

    def __init__(self, path: str, compression: str = "none"):
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}. Received: compression={compression}")
        self._file = open(path, "wb")  # noqa: SIM115  # closed in close()
        # mtime=0 and no name in the GZIP header: the same bytes on every run.
        gzipped = compression == "gzip"
        self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._file, mtime=0) if gzipped else None
        self._zlib = zlib.compressobj() if compression == "zlib" else None

    def _put(self, data: bytes) -> None:
        if self._gzip is not None:
            self._gzip.write(data)
        elif self._zlib is not None:
            self._file.write(self._zlib.compress(data))
        else:
            self._file.write(data)

    def write(self, record: bytes) -> None:
        length = struct.pack("<Q", len(record))
        self._put(length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record)))

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        if self._zlib is not None:
            self._file.write(self._zlib.flush())
        self._file.close()

    def __enter__(self) -> RecordFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
