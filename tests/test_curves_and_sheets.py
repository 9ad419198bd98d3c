"""mode=inspect contact sheets, curves.png, the config tree and TensorBoard extras."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_cats_dogs import make_pets

from conftest import TINY_MODEL, cifar_overrides, compose, write_cifar
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.tasks import run_task
from trainer.tracking.curves import draw_curves
from trainer.tracking.reports import MAX_DRAWN_CLASSES, most_confused, plot_confusion_png
from trainer.tracking.sheets import sheet_layout, tile_origin


@pytest.mark.integration
def test_contact_sheet_tiles_are_the_records_in_order(tmp_path):
    data = write_cifar(tmp_path / "cifar", num_test=16)
    out = tmp_path / "inspect"
    overrides = [
        *cifar_overrides(data),
        "mode=inspect",
        "inspect.split=test",
        "inspect.num_images=9",
        "dataset.standardize=false",
        "dataset.augment.crop=none",
    ]
    run_task(compose(overrides, out))
    sheet = np.asarray(Image.open(out / "contact_sheet.png").convert("RGB"))
    tile = 64  # 32x32 images are doubled to reach 64
    columns, width, height = sheet_layout(9, tile)
    assert columns == 3 and sheet.shape == (3 * height, 3 * width, 3)
    records = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(16, 3073)
    for index in range(4):
        expected = records[index, 1:].reshape(3, 32, 32).transpose(1, 2, 0)
        x, y = tile_origin(index, 9, tile)
        shown = sheet[y : y + tile : 2, x : x + tile : 2]
        np.testing.assert_array_equal(shown, expected, err_msg=f"tile {index}")
    stats = json.loads((out / "inspect.json").read_text())
    labels = records[:, 0]
    assert stats["per_class"] == {
        name: int((labels == i).sum())
        for i, name in enumerate(
            ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
        )
    }
    assert stats["image_shape"] == [32, 32, 3] and stats["max"] <= 255


@pytest.mark.integration
def test_augmented_sheet_shows_host_and_model_augmentation(tmp_path):
    data = write_cifar(tmp_path / "cifar")
    common = [*cifar_overrides(data), "mode=inspect", "inspect.num_images=8", "inspect.augmented=true"]
    no_color = ["dataset.augment.brightness=0", "dataset.augment.contrast_lower=1", "dataset.augment.contrast_upper=1"]
    run_task(compose(common, tmp_path / "color"))
    run_task(compose([*common, *no_color], tmp_path / "plain"))  # same seed: same records, crops and flips
    plain, jittered = (np.asarray(Image.open(tmp_path / name / "contact_sheet.png")) for name in ("plain", "color"))
    assert plain.shape == jittered.shape == (3 * sheet_layout(8, 84)[2], 3 * sheet_layout(8, 84)[1], 3)  # 28x28 tripled
    stats = json.loads((tmp_path / "color" / "inspect.json").read_text())
    assert stats["augmented"] and stats["dtype"] == "uint8" and stats["image_shape"] == [28, 28, 3]
    assert np.abs(plain.astype(int) - jittered.astype(int)).mean() > 5, "the model's colour jitter is shown"


@pytest.mark.integration
def test_inspect_on_cats_dogs_uses_the_manifest(tmp_path):
    make_pets(tmp_path / "in", per_class=6)
    convert(
        tmp_path / "in",
        tmp_path / "records",
        ConvertOptions(image_size=32, val_fraction=0.34, test_fraction=0.34, workers=1),
    )
    out = tmp_path / "inspect"
    run_task(
        compose(
            [
                "dataset=cats_dogs",
                f"dataset.data_dir={tmp_path / 'records'}",
                "dataset.stored_size=32",
                "dataset.image_size=32",
                "mode=inspect",
                "inspect.num_images=4",
            ],
            out,
        )
    )
    stats = json.loads((out / "inspect.json").read_text())
    assert stats["per_class"] == {"Cat": 2, "Dog": 2}
    assert (out / "contact_sheet.png").is_file()


@pytest.mark.integration
def test_training_draws_curves_logs_the_learning_rate_and_sample_images(tmp_path):
    run_dir = tmp_path / "run"
    tiny = [*TINY_MODEL, "trainer.batch_size=16", "trainer.steps_per_epoch=4"]  # the files are the point
    run_task(compose([*tiny, "trainer.epochs=2"], run_dir), show_config=True)
    curves = Image.open(run_dir / "curves.png")
    assert curves.format == "PNG" and curves.size == (1500, 400), "loss, accuracy and learning-rate panels"
    header = (run_dir / "history.csv").read_text().splitlines()[0]
    assert "learning_rate" in header
    assert "dataset" in (run_dir / "config_tree.txt").read_text()
    assert "predict" not in (run_dir / "config_tree.txt").read_text(), "only the sections training reads"
    tags = set()
    for event_file in (run_dir / "tensorboard" / "train").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            tags.update(value.tag for value in event.summary.value)
    assert "input_images" in tags
    assert any("learning_rate" in tag for tag in tags)
    scalars, images = {}, set()  # (run, tag) -> {step: value}; the report's sheets
    for run in ("validation", "test"):
        for event_file in (run_dir / "tensorboard" / run).glob("events.*"):
            for event in tf.compat.v1.train.summary_iterator(str(event_file)):
                for value in event.summary.value:
                    if value.tag.startswith("report/"):
                        images.add(value.tag)
                        continue
                    scalars.setdefault((run, value.tag), {})[event.step] = float(tf.make_ndarray(value.tensor))
    assert images == {"report/mistakes", "report/borderline", "report/calibration", "report/confusion_matrix"}
    assert sorted(scalars["validation", "epoch_accuracy"]) == [1, 2], "epochs from 1, as history.csv numbers them"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert scalars["test", "epoch_accuracy"] == {metrics["best_epoch"]: pytest.approx(metrics["test_accuracy"])}
    assert scalars["test", "epoch_loss"] == {metrics["best_epoch"]: pytest.approx(metrics["test_loss"])}
    assert scalars["test", "epoch_ece"] == {metrics["best_epoch"]: pytest.approx(metrics["test_ece"])}


@pytest.mark.integration
@pytest.mark.parametrize("dataset", ["digits"])
def test_inspect_runs_on_the_bundled_dataset(tmp_path, dataset):
    run_task(
        compose([f"dataset={dataset}", "mode=inspect", "inspect.split=val", "inspect.num_images=4"], tmp_path / "out")
    )
    assert json.loads((tmp_path / "out" / "inspect.json").read_text())["num_examples"] == 200


def _history(val_loss: list[float]) -> list[dict[str, str]]:
    return [
        {
            "epoch": str(index),
            "loss": str(1.0 / (index + 1)),
            "accuracy": str(0.5 + index / 20),
            "val_loss": str(value),
            "val_accuracy": str([0.1, 0.6, 0.9, 0.8][index]),
            "learning_rate": str(0.01 * (1 - index / 4)),
        }
        for index, value in enumerate(val_loss)
    ]


@pytest.mark.unit
def test_curves_have_a_log_loss_integer_epochs_a_title_the_best_epoch_and_the_learning_rate(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    draw_curves(_history([2843.0, 0.9, 0.5, 0.6]), tmp_path / "curves.png", "day/run  ·  dataset=cifar", "val_accuracy")
    loss, accuracy, learning_rate = figures[0].axes
    assert loss.get_yscale() == "log", "a first-epoch val_loss of 2843 must not flatten the rest"
    assert learning_rate.get_title() == "learning rate" and learning_rate.lines[0].get_ydata()[0] == 0.01
    assert all(tick == int(tick) for tick in accuracy.get_xticks())
    assert figures[0].get_suptitle() == "day/run  ·  dataset=cifar, best epoch 3 by val_accuracy"
    best = [line for line in accuracy.lines if line.get_label() == "best: val_accuracy"][0]
    assert (list(best.get_xdata()), list(best.get_ydata())) == ([3], [0.9])


@pytest.mark.unit
def test_drawn_curves_are_a_png(tmp_path):
    path = draw_curves(_history([1.0, 0.9]), tmp_path / "curves.png", "run", "val_loss", "min")
    image = Image.open(path)
    assert image.format == "PNG" and image.size == (1500, 400)


@pytest.mark.unit
def test_curves_are_redrawn_as_often_as_drawing_stays_a_small_share_of_training(tmp_path, monkeypatch):
    """A drawing holds Python's lock for about a second: short epochs must not wait for one after each,
    long ones get a drawing each, and the end of training always draws every epoch."""
    from trainer.tracking import curves as callbacks

    drawn = []
    monkeypatch.setattr(callbacks.Curves, "_draw", lambda self, rows: drawn.append(len(rows)))
    history = tmp_path / "history.csv"
    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])

    def epoch_ends(curves, rows, seconds):
        history.write_text("epoch,loss\n" + "".join(f"{index},1\n" for index in range(rows)))
        clock[0] += seconds
        curves.on_epoch_end(rows - 1)
        curves.drawing.join()

    curves = callbacks.Curves(history, tmp_path / "curves.png")
    for rows in range(1, 5):  # epochs of 1 s; each drawing takes no time on the frozen clock, then a pause...
        epoch_ends(curves, rows, 1.0)
    assert drawn == [1, 2, 3, 4], "a drawing that takes no time may run after every epoch"
    curves.next_drawing = clock[0] + 20.0  # as after a drawing of 1 s
    for rows in range(5, 9):
        epoch_ends(curves, rows, 6.0)
    assert drawn == [1, 2, 3, 4, 8], "epochs of 6 s after a drawing of 1 s: the next one after 20 s"
    curves.next_drawing = clock[0] + 20.0
    history.write_text("epoch,loss\n" + "".join(f"{index},1\n" for index in range(9)))
    curves.on_epoch_end(8)
    slow = threading.Event()
    monkeypatch.setattr(callbacks.Curves, "_draw", lambda self, rows: (slow.wait(10), drawn.append(len(rows))))
    curves.on_train_end()  # returns at once: the last drawing never holds up the end of fit
    assert drawn == [1, 2, 3, 4, 8]
    slow.set()
    callbacks.wait_for_drawings()
    assert drawn == [1, 2, 3, 4, 8, 9], "the end of training draws every epoch"


@pytest.mark.unit
def test_the_progress_bar_runs_within_epochs_and_is_gone_at_their_end(capsys):
    import keras

    from trainer.training.callbacks import ProgressBar

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    bar = ProgressBar(delay=0.0)
    x, y = np.zeros((40, 4), np.float32), np.zeros((40,), np.int32)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[bar])
    err = capsys.readouterr().err
    assert "Epoch 1/2" in err and "Epoch 2/2" in err and "/5 [" in err, err
    assert err.endswith("\r") and not err.split("\r")[-2].strip(), "erased at the end: EpochLog's line stands"
    assert bar.bar is None


@pytest.mark.unit
def test_a_1000_class_confusion_matrix_draws_its_most_confused_classes_in_a_bounded_png(tmp_path):
    """0.6 inch per class made 1000 classes a 60,000-pixel figure: the run died of memory at its end (and again on
    resume). Now the most confused classes are drawn, the title says so, and the PNG stays small."""
    rng = np.random.default_rng(0)
    matrix = np.diag(rng.integers(5, 10, 1000))
    confused = [3, 141, 592, 653, 998]
    for true, predicted in zip(confused, confused[1:] + confused[:1], strict=True):
        matrix[true, predicted] = 40  # the only mistakes: these five must be drawn
    names = [f"class_{index:04d}" for index in range(1000)]
    with Image.open(plot_confusion_png(tmp_path / "confusion.png", matrix, names, "test split")) as drawn:
        assert max(drawn.size) <= 100 * (0.6 * MAX_DRAWN_CLASSES + 2), drawn.size
    chosen = most_confused(matrix)
    assert len(chosen) == MAX_DRAWN_CLASSES and set(confused) <= set(chosen.tolist())
    assert list(chosen) == sorted(chosen), "in class order"
    assert most_confused(matrix[:5, :5]).tolist() == [0, 1, 2, 3, 4], "few classes: every one"
