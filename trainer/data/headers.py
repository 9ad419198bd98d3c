"""What an encoded image's bytes say before any pixel is decoded, read in the TensorFlow graph: its format, its
size, its EXIF orientation, and where a GIF's first frame ends (`trainer.data.decode` decodes by them).

    python run.py mode=inspect inspect.check=true dataset=folder dataset.data_dir=photos/   # sizes, unreadable files

A header that cannot be read gives -1, zeros or orientation 1, and the decode or its checks refuse the image
with the reason; only `image_size` of a corrupt JPEG raises (`extract_jpeg_shape`), so its callers read it in a
`tf.data` map with `ignore_errors`.
"""

from __future__ import annotations

import tensorflow as tf

FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")
_EXIF_HEAD = 1 << 16  # an APP1 segment holds at most 64 KiB, and it comes first in the file
_EXIF_ENTRIES = 64  # IFD0 entries searched for the orientation tag
_ORIENTATION_TAG = 0x0112
_SEGMENTS = 6  # JPEG marker segments walked to find EXIF's APP1 (APP0, APP1, ... come before the image data)
_EXIF_ID = [ord(char) for char in "Exif"] + [0, 0]


def image_format(data: tf.Tensor) -> tf.Tensor:
    """The index in `FORMATS` of each encoded image (a string tensor of any shape), from its first bytes; -1 for
    anything else."""
    head = tf.strings.join([tf.strings.substr(data, 0, 12), b"\x00" * 12])  # a shorter string is no error
    tests = [
        tf.equal(tf.strings.substr(head, 0, 3), b"\xff\xd8\xff"),
        tf.equal(tf.strings.substr(head, 0, 8), b"\x89PNG\r\n\x1a\n"),
        tf.equal(tf.strings.substr(head, 0, 4), b"GIF8"),
        tf.equal(tf.strings.substr(head, 0, 2), b"BM"),
        tf.logical_and(
            tf.equal(tf.strings.substr(head, 0, 4), b"RIFF"), tf.equal(tf.strings.substr(head, 8, 4), b"WEBP")
        ),
    ]
    codes = tf.reshape(tf.range(len(FORMATS)), [len(FORMATS)] + [1] * data.shape.rank)
    return tf.reduce_max(tf.where(tf.stack(tests), codes, -1), axis=0)


def _bytes_at(data: tf.Tensor, offset, length: int) -> tf.Tensor:
    """`length` bytes of each string of `data` ([n]) from its `offset` ([n] or one for all) as int32 [n, length];
    zeros past a string's end (never an error)."""
    ends = tf.strings.length(data)
    offset = tf.clip_by_value(tf.broadcast_to(tf.cast(offset, tf.int32), tf.shape(ends)), 0, ends)  # wrapped too
    piece = tf.strings.substr(data, offset, tf.fill(tf.shape(offset), length))
    padded = tf.strings.substr(tf.strings.join([piece, b"\x00" * length]), 0, length)
    return tf.cast(tf.reshape(tf.io.decode_raw(padded, tf.uint8), [-1, length]), tf.int32)


def _number(values: tf.Tensor, little_endian: tf.Tensor) -> tf.Tensor:
    """An integer from its bytes (the last axis), in either byte order (four bytes past 2**31 wrap negative)."""
    weights = tf.constant([256**index for index in range(values.shape[-1])], tf.int32)
    little = tf.reduce_sum(values * weights, axis=-1)
    big = tf.reduce_sum(values * weights[::-1], axis=-1)
    return tf.where(little_endian, little, big)


def image_size(data: tf.Tensor, kind: tf.Tensor) -> tf.Tensor:
    """(height, width) from the header of one JPEG, PNG, GIF, BMP or WebP without decoding."""
    data = data[tf.newaxis]

    def png():
        values = tf.reshape(_bytes_at(data, 16, 8), [2, 4])
        return tf.reverse(_number(values, tf.constant(False)), [0])

    def gif():
        return tf.reverse(_number(tf.reshape(_bytes_at(data, 6, 4), [2, 2]), tf.constant(True)), [0])

    def bmp():  # int32 little-endian; a negative height means rows stored top-down
        values = tf.bitcast(tf.cast(tf.reshape(_bytes_at(data, 18, 8), [2, 4]), tf.uint8), tf.int32)
        return tf.abs(tf.reverse(values, [0]))

    def webp():  # the first chunk after RIFF....WEBP: VP8 (lossy), VP8L (lossless) or VP8X (extended)
        chunk, head = tf.strings.substr(data[0], 12, 4), _bytes_at(data, 20, 10)[0]  # its tag, its data
        lossy = tf.stack([(head[8] + head[9] * 256) % 16384, (head[6] + head[7] * 256) % 16384])  # after 3+3
        lossless = tf.stack(  # 14 bits of width - 1, then 14 of height - 1, after the 0x2f signature
            [head[2] // 64 + head[3] * 4 + (head[4] % 16) * 1024 + 1, head[1] + (head[2] % 64) * 256 + 1]
        )
        extended = tf.stack(  # 24 bits each of width - 1 and height - 1, after 4 bytes of flags
            [head[7] + head[8] * 256 + head[9] * 65536 + 1, head[4] + head[5] * 256 + head[6] * 65536 + 1]
        )
        unknown = tf.zeros([2], tf.int32)  # the decoder refuses it
        return tf.where(
            tf.equal(chunk, b"VP8 "),
            lossy,
            tf.where(tf.equal(chunk, b"VP8L"), lossless, tf.where(tf.equal(chunk, b"VP8X"), extended, unknown)),
        )

    branches = [lambda: tf.io.extract_jpeg_shape(data[0])[:2], png, gif, bmp, webp]
    return tf.switch_case(tf.maximum(kind, 0), branches)


def _exif_start(data: tf.Tensor) -> tf.Tensor:
    """Where the TIFF header of each JPEG's EXIF segment starts ([n]), walking the marker segments after SOI (at
    most `_SEGMENTS` of them: EXIF's APP1 comes first, or after JFIF's APP0); -1 where there is none."""
    found = tf.fill(tf.shape(data), -1)
    position = tf.fill(tf.shape(data), 2)
    for _ in range(_SEGMENTS):
        head = _bytes_at(data, position, 10)  # FF, marker, two length bytes, "Exif\0\0"
        is_app1 = tf.reduce_all(tf.equal(head[:, :2], [0xFF, 0xE1]), axis=1)
        is_exif = is_app1 & tf.reduce_all(tf.equal(head[:, 4:], _EXIF_ID), axis=1)
        found = tf.where((found < 0) & is_exif, position + 10, found)
        position += 2 + head[:, 2] * 256 + head[:, 3]
    return found


def exif_orientations(data: tf.Tensor) -> tf.Tensor:
    """The EXIF orientation (1 to 8) of each JPEG of `data` ([n]) from tag 0x0112 of IFD0 in its APP1 segment;
    1 where it has none (and for any other format). The whole batch is parsed at once: per image, the few
    dozen small ops would cost as much as a resize."""
    start = _exif_start(data)
    tiff = tf.strings.substr(data, tf.maximum(start, 0), tf.fill(tf.shape(start), _EXIF_HEAD))
    little = tf.equal(tf.strings.substr(tiff, 0, 2), b"II")
    first = _number(_bytes_at(tiff, 4, 4), little)
    count = _number(_bytes_at(tiff, first, 2), little)
    entries = tf.reshape(_bytes_at(tiff, first + 2, 12 * _EXIF_ENTRIES), [-1, _EXIF_ENTRIES, 12])
    tags = _number(entries[..., 0:2], little[:, tf.newaxis])
    values = _number(entries[..., 8:10], little[:, tf.newaxis])  # a SHORT sits in the value field's first two bytes
    matches = tf.logical_and(tf.equal(tags, _ORIENTATION_TAG), tf.range(_EXIF_ENTRIES) < count[:, tf.newaxis])
    value = tf.reduce_max(tf.where(matches, values, 0), axis=1)
    valid = (start >= 0) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, 1)


def exif_orientation(data: tf.Tensor) -> tf.Tensor:
    """The EXIF orientation (1 to 8) of one JPEG; 1 when it has none."""
    return exif_orientations(data[tf.newaxis])[0]


_GIF_STEPS = 1 << 22  # blocks and sub-blocks walked at most to find the end of a GIF's first image


def gif_first_frame(data: tf.Tensor) -> tf.Tensor:
    """A GIF's bytes up to the end of its first image, then the trailer: `decode_gif` decodes every frame of an
    animation before we keep the first (6,000 frames took the process past 6 GB). A stream whose blocks
    cannot be walked is returned whole, for `decode_gif` to judge."""
    length = tf.strings.length(data)
    byte = lambda at: _bytes_at(data[tf.newaxis], at, 1)[0, 0]  # noqa: E731
    screen = byte(10)  # the logical screen's packed field: a global colour table, and its size
    start = 13 + tf.where(screen >= 128, 3 * tf.bitwise.left_shift(2, screen % 8), 0)

    def step(position, mode, end, steps):
        value = byte(position)
        local = byte(position + 9)  # an image descriptor's packed field: a local colour table, and its size
        image = 10 + tf.where(local >= 128, 3 * tf.bitwise.left_shift(2, local % 8), 0) + 1  # + the LZW code size
        at_block = tf.equal(mode, 0)
        # At a block: an extension (0x21) skips its label into sub-blocks; an image (0x2C) its descriptor, table
        # and code size; anything else (the trailer) ends the walk. In sub-blocks: skip one, or end them at 0.
        new_position = tf.where(
            at_block,
            position + tf.where(tf.equal(value, 0x21), 2, tf.where(tf.equal(value, 0x2C), image, 0)),
            position + value + 1,
        )
        new_mode = tf.where(
            at_block,
            tf.where(tf.equal(value, 0x21), 1, tf.where(tf.equal(value, 0x2C), 2, 0)),
            tf.where(tf.equal(value, 0), 0, mode),
        )
        done_image = tf.logical_and(tf.equal(mode, 2), tf.equal(value, 0))
        stop = tf.logical_and(at_block, tf.logical_not(tf.equal(value, 0x21) | tf.equal(value, 0x2C)))
        new_end = tf.where(done_image, new_position, tf.where(stop, length, end))
        return new_position, new_mode, new_end, steps + 1

    def going(position, mode, end, steps):
        return (end < 0) & (position < length) & (steps < _GIF_STEPS)

    _, _, end, _ = tf.while_loop(going, step, (start, tf.constant(0), tf.constant(-1), tf.constant(0)))
    end = tf.where(end < 0, length, end)
    return tf.strings.join([tf.strings.substr(data, 0, end), b"\x3b"])
