"""Embeddings find near-duplicates: a photo re-encoded or resized is nearer to it than other photos of its class.

One tiny model is trained for this module (`tiny_custom_run`): tests/tiny_model.py's conv, pooling and hidden
layer, whose 16 features vary with the image (the quarter-width VGG19 of 1/16 width has 4 in fc2, nearly constant
after one epoch: every pair of images is within 1e-6 of cosine 1).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_MODEL, cifar_overrides, run_cli, write_cifar


@pytest.fixture(scope="module")
def tiny_custom_run(tmp_path_factory) -> Path:
    """The run folder of tests/tiny_model.py trained for one epoch on tiny CIFAR-format files."""
    root = tmp_path_factory.mktemp("embeddings")
    data = write_cifar(root / "cifar", records_per_file=16, num_test=16)
    run_dir = root / "run"
    dataset = [key for key in cifar_overrides(data) if key != "debug=smoke"]  # smoke sets VGG19's keys
    overrides = [*dataset, *TINY_MODEL, "trainer.epochs=1", f"hydra.run.dir={run_dir}"]
    result = run_cli(overrides, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def _photo(seed: int, size: int = 48) -> np.ndarray:
    """A smooth random photo-like image: a few blurred colour blobs."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC))


def _save(pixels: np.ndarray, path: Path, format: str = "PNG", **options) -> None:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format, **options)
    path.write_bytes(buffer.getvalue())


@pytest.mark.integration
@pytest.mark.slow  # ~30 s
def test_predicted_embeddings_find_a_photos_near_duplicates_before_other_photos_of_its_class(tiny_custom_run, tmp_path):
    run_dir = tiny_custom_run
    folder = tmp_path / "photos" / "cat"
    folder.mkdir(parents=True)
    originals = [_photo(seed) for seed in range(6)]
    for index, pixels in enumerate(originals):
        _save(pixels, folder / f"p{index}.png")
        _save(pixels, folder / f"p{index}_reencoded.jpg", "JPEG", quality=70)  # re-encoded
        resized = np.asarray(Image.fromarray(pixels).resize((64, 64), Image.Resampling.BILINEAR))
        _save(resized, folder / f"p{index}_resized.png")  # resized
    (folder / "broken.jpg").write_bytes(b"not an image")  # skipped: a NaN row keeps the order
    output = tmp_path / "out" / "predictions.csv"
    typed = ["mode=predict", f"checkpoint={run_dir}", f"predict.input={tmp_path / 'photos'}"]
    result = run_cli([*typed, f"predict.output={output}", "predict.embeddings=true"])
    assert result.returncode == 0, result.stderr[-3000:]
    vectors = np.load(output.parent / "embeddings.npy")
    rows = list(csv.DictReader(output.open()))
    assert vectors.shape[0] == len(rows) == 3 * len(originals) + 1
    names = [Path(row["file"]).name for row in rows]
    broken = names.index("broken.jpg")
    assert np.isnan(vectors[broken]).all() and not np.isnan(np.delete(vectors, broken, 0)).any()
    row_of = {name: index for index, name in enumerate(names)}
    for index in range(len(originals)):
        anchor = vectors[row_of[f"p{index}.png"]]
        assert np.isclose(np.linalg.norm(anchor), 1, atol=1e-5)
        similarity = {name: float(vectors[row] @ anchor) for name, row in row_of.items() if name != "broken.jpg"}
        duplicates = [similarity[f"p{index}_reencoded.jpg"], similarity[f"p{index}_resized.png"]]
        others = [value for name, value in similarity.items() if not name.startswith(f"p{index}")]
        assert min(duplicates) > max(others), (index, duplicates, max(others))
