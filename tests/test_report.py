"""The evaluation report: per-class figures as scikit-learn computes them, Grad-CAM where the evidence is,
calibration that tells an honest predictor from an over-confident one, and a page that renders."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import cifar_overrides, compose, csv_rows, pattern_records, run_cli, train_arguments
from trainer.errors import ConfigError, DataError
from trainer.evaluation import calibration, classes
from trainer.evaluation.gradcam import GradCam
from trainer.evaluation.report import ReportOptions, write_report
from trainer.models.tta import with_tta
from trainer.tasks import run_task
from trainer.tasks.scoring import Evaluation, check_report_split

NAMES = ["cat", "dog", "fox"]


# -- per-class figures ------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_per_class_figures_are_scikit_learns():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 500)
    predicted = np.where(rng.random(500) < 0.7, labels, rng.integers(0, 4, 500))
    predicted[predicted == 3] = 2  # class 3 is never predicted: its precision is 0, not NaN
    names = ["a", "b", "c", "d"]
    matrix = classes.confusion(labels, predicted, 4)
    rows = classes.class_rows(matrix, names)
    expected = metrics.classification_report(labels, predicted, output_dict=True, zero_division=0)
    for index, row in enumerate(rows):
        for key, theirs in (("precision",) * 2, ("recall",) * 2, ("f1", "f1-score"), ("support",) * 2):
            assert row[key] == pytest.approx(expected[str(index)][theirs]), (names[index], key)
    summary = classes.summary(matrix)
    assert summary["balanced_accuracy"] == pytest.approx(metrics.balanced_accuracy_score(labels, predicted))
    assert summary["macro_f1"] == pytest.approx(metrics.f1_score(labels, predicted, average="macro"))
    assert summary["accuracy"] == pytest.approx(metrics.accuracy_score(labels, predicted))
    # The classes each is confused with: most first, at most three, never itself.
    off = matrix[0].copy()
    off[0] = 0
    assert [count for _, count in rows[0]["confused_with"]] == sorted(off[off > 0].tolist(), reverse=True)[:3]
    assert "a" not in [name for name, _ in rows[0]["confused_with"]]


# -- calibration ------------------------------------------------------------------------------------------------


def _calibrated(count: int, seed: int, temperature: float = 1.0):
    """Labels drawn from the very probabilities reported (a perfectly calibrated predictor at T=1), and
    those probabilities sharpened by 1/`temperature` (over-confident for T<1)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.0, (count, 4))
    honest = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(4, p=row) for row in honest])
    return calibration.scale(honest.astype(np.float32), temperature), labels


@pytest.mark.unit
def test_ece_tells_an_honest_predictor_from_an_over_confident_one_and_the_temperature_undoes_it():
    honest, labels = _calibrated(20000, 0)
    assert calibration.reliability(honest, labels).ece < 0.015
    sharp, labels = _calibrated(20000, 0, temperature=0.4)  # probabilities sharpened: over-confident
    assert calibration.reliability(sharp, labels).ece > 0.08
    fitted = calibration.fit_temperature(sharp, labels)
    assert fitted == pytest.approx(1 / 0.4, rel=0.08), "the temperature that undoes the sharpening"
    assert calibration.reliability(calibration.scale(sharp, fitted), labels).ece < 0.015
    assert calibration.nll(sharp, labels, fitted) < calibration.nll(sharp, labels)


@pytest.mark.unit
def test_reliability_bins_are_half_open_and_count_every_example():
    probabilities = np.array([[1.0, 0.0], [0.5, 0.5], [0.55, 0.45], [0.0, 1.0]], np.float32)
    table = calibration.reliability(probabilities, np.array([0, 1, 1, 1]), bins=10)
    assert table.counts.sum() == 4 and table.counts[-1] == 2 and table.counts[4] == 1 and table.counts[5] == 1
    assert table.accuracy[4] == 0.0 and table.accuracy[-1] == 1.0  # 0.5 falls in (0.4, 0.5]; argmax picks 0


# -- Grad-CAM ---------------------------------------------------------------------------------------------------


def _quadrant_data(count: int, seed: int):
    """16x16 images of noise with stripes in the top-left quadrant: class 0 horizontal, class 1 vertical."""
    rng = np.random.default_rng(seed)
    images = rng.integers(40, 200, (count, 16, 16, 3)).astype(np.uint8)
    labels = np.arange(count) % 2
    stripes = np.tile(np.array([230, 20], np.uint8), 4)
    for image, label in zip(images, labels, strict=True):
        phase = rng.integers(0, 2)
        image[:8, :8] = (np.roll(stripes, phase)[None, :] if label else np.roll(stripes, phase)[:, None])[..., None]
    return images, labels


def _quadrant_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    image = keras.Input((16, 16, 3), dtype="uint8", name="image")
    x = keras.layers.Rescaling(1 / 255, name="to_float")(image)
    inner = keras.Input((16, 16, 3))
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inner)
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv2")(y)
    y = keras.layers.GlobalAveragePooling2D(name="pool")(y)
    network = keras.Model(inner, keras.layers.Dense(2, activation="softmax", name="predictions")(y), name="net")
    model = keras.Model(image, network(x), name="net")
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def quadrant_model():
    images, labels = _quadrant_data(600, 0)
    model = _quadrant_model()
    model.fit(images, labels, batch_size=32, epochs=12, verbose=0)
    test_images, test_labels = _quadrant_data(200, 1)
    assert model.evaluate(test_images, test_labels, verbose=0)[1] > 0.95, "the model learned the quadrant rule"
    return model


@pytest.mark.integration
def test_grad_cam_puts_its_mass_in_the_quadrant_that_decides_the_class(quadrant_model):
    images, labels = _quadrant_data(64, 2)
    cam = GradCam.build(quadrant_model, None)
    assert cam.layer == "conv2", "by default the last convolution block's output"
    heat = cam(images, labels)
    assert heat.shape == images.shape[:3] and heat.min() >= 0 and heat.max() <= 1
    top_left = heat[:, :8, :8].sum(axis=(1, 2)) / np.maximum(heat.sum(axis=(1, 2)), 1e-9)
    assert np.median(top_left) > 0.5, f"most of the mass (a quarter when spread evenly): {top_left}"


@pytest.mark.integration
def test_cam_layer_names_a_4d_layer_or_says_what_it_is(quadrant_model):
    assert GradCam.build(quadrant_model, "conv1").layer == "conv1"
    with pytest.raises(
        ConfigError, match=r"^evaluate.cam_layer: no layer 'conv9' in the model; its 4-D layers: .*conv2"
    ):
        GradCam.build(quadrant_model, "conv9")
    with pytest.raises(ConfigError, match=r"^evaluate.cam_layer: 'pool' has a 2-D output; Grad-CAM needs a 4-D"):
        GradCam.build(quadrant_model, "pool")
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    assert GradCam.build(dense, None) is None, "no convolution: the report goes on without heat maps"


# -- the report -------------------------------------------------------------------------------------------------


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tables, self.title = [], 0, ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        self.tables += tag == "table"


def _dataset(images, labels, batch=16):
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch)


@pytest.mark.integration
def test_the_report_is_one_self_contained_page_with_the_figures_of_the_predictions(quadrant_model, tmp_path):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    images, labels = _quadrant_data(96, 3)
    val_images, val_labels = _quadrant_data(64, 4)
    val_labels[::8] = 1 - val_labels[::8]  # 8 mislabelled: enough mistakes for a temperature to be fitted
    dataset = _dataset(images, labels)
    figures = write_report(tmp_path, quadrant_model, quadrant_model, dataset, ["horizontal", "vertical"], "test",
                           ReportOptions(images=5), _dataset(val_images, val_labels))  # fmt: skip
    folder = tmp_path / "report"
    assert sorted(path.name for path in folder.iterdir()) == [
        "borderline.png", "calibration.png", "confusion_matrix.png", "mistakes.png", "per_class.csv", "report.html"
    ]  # fmt: skip
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".")], "no temporary folder left"
    page = _Page()
    page.feed((folder / "report.html").read_text())
    assert len(page.images) == 4 and page.tables == 2
    for source in page.images:
        assert source.startswith("data:image/png;base64,"), "embedded: readable offline"
        Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).verify()
    predicted = quadrant_model.predict(images, verbose=0)
    rows = {row["class"]: row for row in csv_rows(folder / "per_class.csv")}
    expected = sklearn_metrics.classification_report(
        labels, predicted.argmax(axis=1), output_dict=True, zero_division=0
    )
    for index, name in enumerate(["horizontal", "vertical"]):
        assert float(rows[name]["f1"]) == pytest.approx(expected[str(index)]["f1-score"], abs=1e-6)
        assert int(rows[name]["support"]) == expected[str(index)]["support"]
    assert figures["ece"] == pytest.approx(calibration.reliability(predicted, labels).ece, abs=1e-5)
    assert 0.05 <= figures["temperature"] <= 20 and "ece_scaled" in figures
    sheet = Image.open(folder / "borderline.png")
    assert sheet.width > sheet.height, "five tiles, each an image beside its heat map"


@pytest.mark.integration
def test_a_report_of_no_mistake_says_so_and_one_of_one_class_is_refused(quadrant_model, tmp_path):
    images, labels = _quadrant_data(200, 5)
    right = quadrant_model.predict(images, verbose=0).argmax(axis=1) == labels
    names = ["horizontal", "vertical"]
    write_report(tmp_path, quadrant_model, quadrant_model, _dataset(images[right], labels[right]), names, "val",
                 ReportOptions(images=4))  # fmt: skip
    empty = np.asarray(Image.open(tmp_path / "report" / "mistakes.png").convert("L"))
    assert empty.shape[0] < 100 and empty.min() < 128, "a small sheet with a line of text on it"
    assert "No validation split" in (tmp_path / "report" / "report.html").read_text()
    ones = labels == 1
    with pytest.raises(DataError, match=r"^evaluate.report: the test split holds one class \(vertical\)"):
        write_report(tmp_path / "x", quadrant_model, quadrant_model, _dataset(images[ones], labels[ones]), names,
                     "test", ReportOptions())  # fmt: skip
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir()), "nothing half-written"


@pytest.mark.integration
def test_the_report_of_a_flip_tta_model_reads_its_heat_maps_from_the_plain_one(quadrant_model, tmp_path):
    images, labels = _quadrant_data(48, 6)
    tta = with_tta(quadrant_model, "flip")
    write_report(tmp_path, tta, quadrant_model, _dataset(images, labels), ["horizontal", "vertical"], "test",
                 ReportOptions(images=3))  # fmt: skip
    assert (tmp_path / "report" / "mistakes.png").exists()


@pytest.mark.integration
def test_evaluate_writes_the_report_and_its_figures_in_metrics_json(trained_run, tmp_path):
    data, run_dir = trained_run
    assert (run_dir / "report" / "report.html").is_file(), "training writes one for the test split"
    training = json.loads((run_dir / "metrics.json").read_text())
    assert {"test_ece", "test_temperature", "test_balanced_accuracy", "test_macro_f1"} <= set(training)
    overrides = [*cifar_overrides(data), "mode=evaluate", f"checkpoint={run_dir}", "evaluate.split=val"]
    run_task(compose(overrides, tmp_path / "val"), overrides=overrides)
    metrics = json.loads((tmp_path / "val" / "metrics.json").read_text())
    assert "ece" in metrics and "temperature" not in metrics, "the val split is not calibrated on itself"
    assert (tmp_path / "val" / "report" / "per_class.csv").is_file()
    overrides = [*overrides[:-1], "evaluate.report=false"]
    run_task(compose(overrides, tmp_path / "none"), overrides=overrides)
    assert not (tmp_path / "none" / "report").exists()


@pytest.mark.unit
def test_report_images_must_be_positive():
    from trainer.config import to_settings

    with pytest.raises(ConfigError, match=r"^evaluate.report_images must be >= 1 \(or evaluate.report=false"):
        to_settings(compose(["evaluate.report_images=0"]))


CHECK_IMAGES = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const loaded = images.filter((image) => image.complete && image.naturalWidth > 0).length;
  document.title = `images ${loaded}/${images.length}`;
});
</script>"""


@pytest.mark.e2e
@pytest.mark.slow  # a browser start
def test_the_report_renders_in_headless_chromium_with_every_image_and_no_console_error(quadrant_model, tmp_path):
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine (Debian: apt install chromium)")
    images, labels = _quadrant_data(64, 7)
    write_report(tmp_path, quadrant_model, quadrant_model, _dataset(images, labels), ["horizontal", "vertical"],
                 "test", ReportOptions(images=4), _dataset(*_quadrant_data(32, 8)))  # fmt: skip
    page = (tmp_path / "report" / "report.html").read_text()
    probe = tmp_path / "probe.html"  # the page as written, with a script that counts the images that loaded
    probe.write_text(page.replace("</body>", CHECK_IMAGES + "</body>"))
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "<title>images 4/4</title>" in result.stdout, result.stdout[:500] + result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console


@pytest.mark.integration
def test_a_test_split_of_one_class_stops_training_after_its_first_step_before_anything_is_saved(tmp_path):
    """The report at the end needs two classes in the test split: a test file whose labels are all `cat` was
    found only after the whole training. Now it is one line right after the first step (checked in its shadow,
    `trainer.tasks.plan.LateChecks`; labels read, no image decoded), before any epoch or checkpoint is saved."""
    run_dir = tmp_path / "run"
    arguments = [*train_arguments(tmp_path, run_dir, epochs=1), "evaluate.report=true"]
    (tmp_path / "cifar" / "test_batch.bin").write_bytes(pattern_records(np.full(16, 3), 80))  # class 3: cat
    result = run_cli(arguments, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: evaluate.report: the test split holds one class (cat); per-class figures and calibration need two "
        "or more (evaluate.report=false evaluates without the report)"
    )
    assert "First training step done" in (run_dir / "run.log").read_text(), "checked after the first step"
    assert not (run_dir / "history.csv").exists(), "no epoch was saved"
    assert not list((run_dir / "checkpoints").glob("*.keras")), "no checkpoint was saved"


@pytest.mark.unit
def test_a_test_split_of_one_class_is_refused_from_the_parts_counts_where_it_has_them():
    """`dataset=folder` counts each split's classes from its files: the check then reads nothing."""

    def unread(split):
        raise AssertionError("the counts were known")

    counts = {"test": {"cat": 3, "dog": 0}, "val": {"cat": 1, "dog": 2}}
    data = SimpleNamespace(class_counts=counts, class_names=["cat", "dog"], labels_of=unread)
    report = Evaluation(report=ReportOptions())
    with pytest.raises(DataError, match=r"^evaluate.report: the test split holds one class \(cat\)"):
        check_report_split(data, "test", report)
    check_report_split(data, "test", Evaluation())  # no report: nothing to draw
    check_report_split(data, "val", report)
    unknown = SimpleNamespace(class_counts=None, class_names=["cat", "dog"], labels_of=lambda split: np.array([1, 1]))
    with pytest.raises(DataError, match=r"holds one class \(dog\)"):
        check_report_split(unknown, "test", report)
