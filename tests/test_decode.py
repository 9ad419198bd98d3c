"""The one decode (`trainer.data.decode`): Pillow's pixels for every format and EXIF orientation, eagerly and in
tf.data, and one photo giving the same pixels through training, predict on files and on records, `serve_bytes`
and the converter."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from conftest import ROOT, SUBPROCESS_ENV, compose, csv_rows
from trainer.config.store import to_settings
from trainer.data import predict_inputs, tfrecords
from trainer.data.decode import decode_image, decode_rgb
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.data.headers import exif_orientation
from trainer.data.images import decode_files
from trainer.data.preprocess import Preprocess
from trainer.runs.checkpoints import ModelInfo
from trainer.serving.saved_model import bytes_pixels
from trainer.tasks import run_task
from trainer.tasks.data import load_data

RNG = np.random.default_rng(0)


def _encode(image: Image.Image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def _smooth(height: int, width: int) -> np.ndarray:
    """A photo-like image (smooth gradients and noise), so JPEG keeps some detail."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    return np.clip(base + RNG.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


def _pillow(data: bytes) -> np.ndarray:
    """What Pillow shows a person: upright, transparency over white, RGB."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode.startswith("I;16"):  # 16-bit gray: scaled to 8 bits (Pillow's own conversion clips)
            gray = np.rint(np.asarray(image).astype(np.float64) / 257).astype(np.uint8)
            return np.repeat(gray[..., None], 3, axis=-1)
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        return np.asarray(image.convert("RGB"))


def _rotated_jpeg(orientation: int, pixels: np.ndarray) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes())


def _awkward_files() -> dict[str, bytes]:
    """One JPEG with an EXIF rotation, a PNG with alpha, a grayscale JPEG, a CMYK JPEG (the PetImages kinds)."""
    photo = _smooth(30, 44)
    alpha = np.concatenate([photo, RNG.integers(0, 256, (30, 44, 1)).astype(np.uint8)], -1)
    return {
        "rotated.jpg": _rotated_jpeg(6, photo),
        "alpha.png": _encode(Image.fromarray(alpha, "RGBA"), "PNG"),
        "gray.jpg": _encode(Image.fromarray(photo).convert("L"), "JPEG", quality=90),
        "cmyk.jpg": _encode(Image.fromarray(photo).convert("CMYK"), "JPEG", quality=90),
    }


@pytest.mark.unit
@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_stands_upright_as_pillow_shows_it(orientation):
    data = _rotated_jpeg(orientation, _smooth(20, 36))
    assert int(exif_orientation(tf.constant(data))) == orientation
    np.testing.assert_array_equal(decode_rgb(tf.constant(data)).numpy(), _pillow(data))


@pytest.mark.unit
def test_every_format_gives_pillows_pixels_eagerly_and_inside_tf_data():
    photo = _smooth(24, 40)
    rgba = np.concatenate([photo, RNG.integers(0, 256, (24, 40, 1)).astype(np.uint8)], -1)
    palette = Image.fromarray(photo).convert("P", palette=Image.Palette.ADAPTIVE)
    files = {
        **_awkward_files(),
        "png": _encode(Image.fromarray(photo), "PNG"),
        "gray+alpha.png": _encode(Image.fromarray(rgba, "RGBA").convert("LA"), "PNG"),
        "16bit.png": _encode(Image.fromarray(photo[..., 0].astype(np.uint16) * 257), "PNG"),
        "bmp": _encode(Image.fromarray(photo), "BMP"),
        "gif": _encode(palette, "GIF"),
        "webp": _encode(Image.fromarray(photo), "WEBP", lossless=True),
        "jpeg": _encode(Image.fromarray(photo), "JPEG", quality=90),
    }
    for name, data in files.items():
        np.testing.assert_array_equal(decode_rgb(tf.constant(data)).numpy(), _pillow(data), err_msg=name)
    mapped = tf.data.Dataset.from_tensor_slices(list(files.values())).map(lambda data: decode_image(data, 16, "crop"))
    for (name, data), image in zip(files.items(), mapped, strict=True):
        np.testing.assert_array_equal(image.numpy(), decode_image(tf.constant(data), 16, "crop").numpy(), name)


@pytest.mark.unit
def test_resize_modes_and_the_reduced_dct_scale():
    photo = _smooth(30, 40)
    data = _encode(Image.fromarray(photo), "PNG")
    np.testing.assert_array_equal(decode_image(tf.constant(data), 30, "crop").numpy(), photo[:, 5:35])
    padded = decode_image(tf.constant(data), 40, "pad").numpy()
    np.testing.assert_array_equal(padded[5:35], photo)
    assert not padded[:5].any() and not padded[35:].any(), "pad: centred on black"
    assert decode_image(tf.constant(data), 16, "resize").shape == (16, 16, 3)
    # A 4000x3000 phone photo read at 1/8 in the DCT for a 224 output: close to the full decode, resized.
    large = _encode(Image.fromarray(_smooth(300, 400)).resize((4000, 3000), Image.Resampling.BILINEAR), "JPEG")
    reduced = decode_image(tf.constant(large), 224).numpy().astype(int)
    full = tf.image.resize(decode_rgb(tf.constant(large)), [224, 224], antialias=True).numpy()
    assert np.abs(reduced - full).mean() < 2.0


@pytest.mark.unit
def test_what_is_no_image_or_too_large_gets_its_reason(tmp_path):
    big = _encode(Image.new("L", (5000, 4000)), "PNG")
    for name, data in {"text.jpg": b"hello", "big.png": big, "empty.png": b""}.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "cut.jpg").write_bytes(_awkward_files()["gray.jpg"][:300])
    paths = [str(tmp_path / name) for name in ("big.png", "cut.jpg", "empty.png", "text.jpg")]
    runs = list(decode_files(paths, 8, max_pixels=10_000_000))
    errors = [error for run in runs for error in run.errors]
    assert errors[0] == "decompression bomb: an image of 5000 x 4000 pixels, over the limit of 10000000"
    assert errors[1].startswith("corrupt or truncated image")
    assert errors[2:] == ["empty file", "not a JPEG, PNG, GIF, BMP or WebP image"]


# --- one photo, five paths ------------------------------------------------------------------------------------------


def _pets(root: Path) -> Path:
    """train/ and val/ folders of the awkward files (and their mirror images), two classes."""
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for name, data in _awkward_files().items():
                (root / split / label / name).write_bytes(data)
    return root


@pytest.mark.slow
@pytest.mark.integration
def test_one_photo_gives_the_same_pixels_and_probabilities_on_every_path(tmp_path):
    root = _pets(tmp_path / "pets")
    names = sorted(_awkward_files())
    files = [root / "val" / "a" / name for name in names]
    overrides = ["dataset=folder", f"dataset.data_dir={root}", "dataset.image_size=32", "debug=smoke",
                 "trainer.batch_size=4", "dataset.augment.flip=false"]  # fmt: skip
    # 1. Training's evaluation path: the val split of the folder, in file order (class a first).
    data = load_data(to_settings(compose(overrides)).dataset, 8, 0)
    listed = [entry[0] for entry in data.fingerprint["val"]["files"]][:4]
    assert listed == [f"val/a/{name}" for name in names]
    training = np.concatenate([images.numpy() for images, _ in data.split("val")])[:4]
    # 2. mode=predict on the files.
    chunks = predict_inputs.image_chunks(files, None, Preprocess(32), ["a", "b"], 8, "resize")
    predicted = np.concatenate([images.numpy() for _, images in chunks])
    # 3 and 5. The converter's records (raw pixels at the model's size), and mode=predict on them.
    flat = tmp_path / "flat"  # unlabeled: the records keep the file names
    flat.mkdir()
    for path in files:
        (flat / path.name).write_bytes(path.read_bytes())
    convert(flat, tmp_path / "records", ConvertOptions(image_size=32, format="raw", workers=1))
    shards = sorted(str(path) for path in (tmp_path / "records").glob("test.tfrecords_*"))
    spec = tfrecords.RecordSpec.for_format("raw", 32)
    stored = {}
    for record in tf.data.TFRecordDataset(shards):
        example = tf.train.Example.FromString(record.numpy())
        name = example.features.feature["filename"].bytes_list.value[0].decode()
        stored[name] = np.frombuffer(example.features.feature["img_raw"].bytes_list.value[0], np.uint8)
    converted = np.stack([stored[name].reshape(32, 32, 3) for name in names])
    order, batches = [], []
    for items, images in predict_inputs.tfrecord_chunks(shards, spec, Preprocess(32), 2, 16, "resize"):
        order += [item.id for item in items]
        batches.append(images.numpy())
    record_images = np.concatenate(batches)
    from_records = np.stack([record_images[order.index(name)] for name in names])
    # 4. serve_bytes: the pixels the exported graph hands the network.
    info = ModelInfo(("a", "b"), 32, 32, "none", resize_mode="resize")
    served = bytes_pixels(info)(tf.constant([path.read_bytes() for path in files])).numpy()
    for path_name, pixels in (("predict on files", predicted), ("converter", converted),
                              ("predict on records", from_records), ("serve_bytes", served)):  # fmt: skip
        assert np.abs(pixels.astype(int) - training.astype(int)).max() == 0, path_name
    # The probabilities: mode=predict's CSV and the exported SavedModel's serve_bytes, for the same files.
    run_task(compose(overrides, tmp_path / "run"))
    output = tmp_path / "predictions.csv"
    run_task(compose([*overrides, "mode=predict", f"checkpoint={tmp_path / 'run'}", f"predict.input={root / 'val'}",
                      f"predict.output={output}"], tmp_path / "predict"))  # fmt: skip
    table = {row["id"]: [float(row["prob_a"]), float(row["prob_b"])] for row in csv_rows(output)}
    run_task(compose([*overrides, "mode=export", f"checkpoint={tmp_path / 'run'}", f"export.dir={tmp_path / 'e'}",
                      "export.format=saved_model"], tmp_path / "export"))  # fmt: skip
    exported = tf.saved_model.load(str(tmp_path / "e" / "1")).signatures["serve_bytes"]
    served = exported(image_bytes=tf.constant([path.read_bytes() for path in files]))["probabilities"].numpy()
    np.testing.assert_allclose(served, np.array([table[f"a/{name}"] for name in names]), atol=1e-6)


GIF_BOMB = """
import io, resource, sys
from PIL import Image
one = io.BytesIO()
Image.new("RGB", (2000, 2000), (10, 200, 30)).save(one, "GIF")
one = one.getvalue()
start = 13 + (3 * (2 << (one[10] & 7)) if one[10] & 0x80 else 0)  # after the header and the global colour table
data = one[:start] + one[start:-1] * 1000 + b";"  # 1000 frames of 2000 x 2000: 12 GB decoded, a 4 MB file
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
import tensorflow as tf
from trainer.data.decode import decode_image
image = decode_image(tf.constant(data), 32).numpy()
print(image.shape, image[0, 0].tolist())
"""


@pytest.mark.integration
def test_an_animated_gif_decodes_its_first_frame_only_under_a_memory_limit():
    """`decode_gif` decodes every frame before the first is kept: 1000 frames of 2000 x 2000 would need 12 GB."""
    result = subprocess.run(
        [sys.executable, "-c", GIF_BOMB], cwd=ROOT, capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "(32, 32, 3) [10, 200, 30]"


@pytest.mark.unit
@pytest.mark.parametrize(
    "options", [{}, {"lossless": True}, {"exif": b"Exif\x00\x00II*\x00"}], ids=["VP8", "VP8L", "VP8X"]
)
def test_a_webps_size_is_read_from_its_header_in_each_of_its_three_forms(options):
    """Lossy, lossless and extended WebP keep width and height in different bit fields; without them a WebP
    decompression bomb would reach the decoder that `export.max_pixels` guards."""
    from trainer.data.headers import image_format, image_size

    for width, height in [(1, 1), (30, 40), (300, 17), (16383, 2)]:
        buffer = io.BytesIO()
        pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3)).astype(np.uint8)
        Image.fromarray(pixels).save(buffer, format="WEBP", **options)
        data = tf.constant(buffer.getvalue())
        assert image_size(data, image_format(data)).numpy().tolist() == [height, width]
