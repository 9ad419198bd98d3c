"""mode=evaluate and mode=predict on a tiny trained model: agreement with training, order, bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, cifar_overrides, compose, csv_rows
from trainer.config import to_settings
from trainer.errors import ConfigError, DataError
from trainer.tasks import run_task

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(trained_run):
    """The session's tiny CIFAR model trained for 2 epochs, with dropout on (model.dropout=0.5)."""
    return trained_run


def _task(overrides: list[str], out):
    """What `python run.py OVERRIDES` runs, with the run folder `out`."""
    return run_task(compose(overrides, out), overrides=overrides)


def _evaluate(data, checkpoint, out, *extra):
    _task([*cifar_overrides(data), "mode=evaluate", f"checkpoint={checkpoint}", *extra], out)
    return json.loads((out / "metrics.json").read_text())


def test_evaluate_agrees_with_training_and_is_bit_identical(trained, tmp_path):
    data, run_dir = trained
    training = json.loads((run_dir / "metrics.json").read_text())
    first = _evaluate(data, run_dir, tmp_path / "a")
    second = _evaluate(data, run_dir / "checkpoints" / "best.keras", tmp_path / "b")
    assert first["accuracy"] == pytest.approx(training["test_accuracy"], abs=1e-6)
    assert first["loss"] == pytest.approx(training["test_loss"], rel=1e-4)
    assert first["num_examples"] == 24
    # Dropout is off: the same checkpoint gives the same numbers, bit for bit.
    for key in ("loss", "accuracy", "top5_accuracy", "per_class"):
        assert first[key] == second[key], key
    assert set(first["per_class"]) == {
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    }
    assert {"precision", "recall", "f1", "support"} <= set(first["per_class"]["cat"])
    with open(tmp_path / "a" / "confusion_matrix_test.csv") as handle:
        rows = list(csv.reader(handle))
    assert rows[0][1:] == list(first["per_class"]) and len(rows) == 11
    assert sum(int(count) for row in rows[1:] for count in row[1:]) == 24
    assert (tmp_path / "a" / "confusion_matrix_test.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_reported_loss_is_the_cross_entropy_and_the_penalty_is_apart(trained):
    """Keras's loss adds the L2 penalty (model.weight_decay=5e-4 here); test_loss, val_loss and the history's
    loss are the data loss, the penalty is `regularization_loss` beside them."""
    data, run_dir = trained
    metrics = json.loads((run_dir / "metrics.json").read_text())
    records = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(-1, 3073)
    labels = records[:, 0].astype(int)
    images = np.ascontiguousarray(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)[:, 2:30, 2:30])
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    probabilities = model.predict(images, verbose=0)
    by_hand = float(np.mean(-np.log(np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0))))
    assert metrics["test_loss"] == pytest.approx(by_hand, rel=1e-4)
    penalty = sum(float(loss) for loss in model.losses)
    assert penalty > 0.01 and metrics["test_regularization_loss"] == pytest.approx(penalty, rel=1e-3)
    rows = csv_rows(run_dir / "history.csv")
    assert all(float(row["regularization_loss"]) > 0.01 for row in rows)
    best = rows[metrics["best_epoch"] - 1]  # best.keras holds the weights of its end
    assert metrics["val_loss"] == pytest.approx(float(best["val_loss"]), abs=1e-6)
    assert float(best["regularization_loss"]) == pytest.approx(penalty, rel=1e-3)


def test_the_log_states_the_models_input_size_and_where_it_comes_from(trained):
    _, run_dir = trained
    log = (run_dir / "run.log").read_text()
    assert "Model input 28x28: images resized to 32, then cropped to 28 (dataset.augment.crop_size)" in log


def test_evaluate_on_the_validation_split_says_where_it_wrote(trained, tmp_path, caplog):
    data, run_dir = trained
    with caplog.at_level("INFO"):
        metrics = _evaluate(data, run_dir, tmp_path / "val", "evaluate.split=val")
    assert metrics["split"] == "val" and metrics["num_examples"] == 16
    written = (
        f"Wrote confusion_matrix_val.csv, confusion_matrix_val.png, metrics.json, report/ to "
        f"{(tmp_path / 'val').resolve()}"
    )
    assert written in caplog.text


def test_the_run_summary_names_tensorboard_only_where_it_wrote(tmp_path):
    from trainer.tracking.reports import run_summary

    metrics = {"best_epoch": 1, "epochs_completed": 2, "objective_metric": "val_accuracy", "val_accuracy": 0.5}
    metrics |= {"test_accuracy": 0.5, "test_loss": 0.7, "train_seconds": 3.0}
    assert "tensorboard" not in run_summary(tmp_path, metrics), "logger=csv: no tensorboard folder"
    board = str(tmp_path / "tensorboard")
    assert f"tensorboard --logdir {tmp_path.resolve() / 'tensorboard'}" in run_summary(tmp_path, metrics, board)
    assert "tensorboard --logdir gs://b/job/logs" in run_summary(tmp_path, metrics, "gs://b/job/logs")


def test_predict_on_records_keeps_input_order(trained, tmp_path):
    data, run_dir = trained
    labels = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(24, 3073)[:, 0]
    output = tmp_path / "predictions.csv"
    accuracy = _task(
        [
            *cifar_overrides(data),
            "mode=predict",
            f"checkpoint={run_dir}",
            f"predict.input={data}/test_batch.bin",
            f"predict.output={output}",
        ],
        tmp_path / "r",
    )
    rows = csv_rows(output)
    assert [row["id"] for row in rows] == [str(index) for index in range(24)]
    assert [int(row["true_index"]) for row in rows] == labels.tolist()
    settings = to_settings(compose(cifar_overrides(data), tmp_path / "unused"))
    names = list(settings.dataset.class_names)
    probabilities = np.array([[float(row[f"prob_{name}"]) for name in names] for row in rows])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    predicted = [int(row["predicted_index"]) for row in rows]
    assert predicted == probabilities.argmax(axis=1).tolist()
    assert accuracy == pytest.approx(np.mean(np.array(predicted) == labels))
    # The CSV agrees with the saved model applied, in a process that imports nothing of this project, to the
    # same records as uint8 pixels (channel-first planes to HWC, then the evaluation centre crop 32 -> 28).
    records = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(24, 3073)
    pixels = records[:, 1:].reshape(24, 3, 32, 32).transpose(0, 2, 3, 1)[:, 2:30, 2:30, :]
    np.save(tmp_path / "pixels.npy", pixels)
    script = (
        "import sys, numpy as np, keras\n"
        "assert not any(name.startswith('trainer') for name in sys.modules)\n"
        f"model = keras.saving.load_model({str(run_dir / 'checkpoints' / 'best.keras')!r})\n"
        f"pixels = np.load({str(tmp_path / 'pixels.npy')!r})\n"
        f"np.save({str(tmp_path / 'keras.npy')!r}, model.predict(pixels, verbose=0))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, cwd=tmp_path)
    expected = np.load(tmp_path / "keras.npy")
    names = [header[len("prob_") :] for header in rows[0] if header.startswith("prob_")]
    assert names == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    csv_probabilities = np.array([[float(row[f"prob_{name}"]) for name in names] for row in rows])
    np.testing.assert_allclose(csv_probabilities, expected, rtol=1e-6, atol=1e-7)
    assert predicted == expected.argmax(axis=1).tolist()


def test_predict_top_k_gives_the_k_most_probable_classes_in_order_and_evaluate_top_k_its_accuracy(trained, tmp_path):
    data, run_dir = trained
    output = tmp_path / "top.csv"
    typed = [*cifar_overrides(data), "mode=predict", f"checkpoint={run_dir}", f"predict.input={data}/test_batch.bin"]
    _task([*typed, f"predict.output={output}", "predict.top_k=3"], tmp_path / "p")
    rows = csv_rows(output)
    header = list(rows[0])
    assert header[header.index("prob_truck") + 1 : header.index("true_index")] == [
        "top1_class", "top1_prob", "top2_class", "top2_prob", "top3_class", "top3_prob"
    ]  # fmt: skip
    for row in rows:
        probabilities = {name[len("prob_") :]: float(row[name]) for name in header if name.startswith("prob_")}
        ranked = sorted(probabilities, key=lambda name: -probabilities[name])[:3]
        assert [row[f"top{rank}_class"] for rank in (1, 2, 3)] == ranked
        assert row["top1_class"] == row["predicted_class"]
        assert float(row["top2_prob"]) == probabilities[ranked[1]]
    with pytest.raises(ConfigError, match=r"^predict.top_k=11: the model has 10 classes"):
        _task([*typed, f"predict.output={tmp_path / 'x.csv'}", "predict.top_k=11"], tmp_path / "q")
    three = _evaluate(data, run_dir, tmp_path / "e", "evaluate.top_k=3", "evaluate.report=false")
    assert "top3_accuracy" in three and "top5_accuracy" not in three
    assert three["accuracy"] <= three["top3_accuracy"] <= 1.0


def test_predict_gives_a_record_whose_label_is_no_class_its_row(trained, tmp_path):
    data, run_dir = trained
    records = np.frombuffer((data / "test_batch.bin").read_bytes(), np.uint8).reshape(24, 3073)[:6].copy()
    records[3, 0] = 12  # the model has 10 classes
    (tmp_path / "odd.bin").write_bytes(records.tobytes())
    overrides = [*cifar_overrides(data), "mode=predict", f"checkpoint={run_dir}", f"predict.input={tmp_path}/odd.bin"]
    _task([*overrides, f"predict.output={tmp_path / 'odd.csv'}"], tmp_path / "r")
    _task(
        [*overrides[:-1], f"predict.input={data}/test_batch.bin", f"predict.output={tmp_path / 'all.csv'}"],
        tmp_path / "s",
    )
    rows, reference = csv_rows(tmp_path / "odd.csv"), csv_rows(tmp_path / "all.csv")[:6]
    assert [row["id"] for row in rows] == ["0", "1", "2", "3", "4", "5"]
    assert rows[3]["error"] == f"{tmp_path / 'odd.bin'}: record 3 has label 12, expected 0 to 9 (the model's classes)"
    assert rows[3]["predicted_class"] == rows[3]["true_class"] == ""
    for row, expected in zip(rows[:3] + rows[4:], reference[:3] + reference[4:], strict=True):
        assert (row["predicted_class"], row["true_class"], row["error"]) == (
            expected["predicted_class"],
            expected["true_class"],
            "",
        )
        assert float(row["prob_cat"]) == pytest.approx(float(expected["prob_cat"]), rel=1e-5)


def test_predict_on_an_image_folder_reports_skipped_files(trained, tmp_path):
    data, run_dir = trained
    folder = tmp_path / "images"
    for name, size in (("cat/b.png", (40, 20)), ("dog/a.jpg", (32, 32)), ("dog/c.jpg", (8, 50))):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((size[1], size[0], 3), 90, np.uint8)).save(folder / name)
    (folder / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    output = tmp_path / "out.csv"
    _task(
        [
            *cifar_overrides(data),
            "mode=predict",
            f"checkpoint={run_dir}",
            f"predict.input={folder}",
            f"predict.output={output}",
        ],
        tmp_path / "r",
    )
    rows = csv_rows(output)
    assert [row["id"] for row in rows] == ["cat/b.png", "cat/broken.jpg", "dog/a.jpg", "dog/c.jpg"]
    assert rows[1]["error"].startswith("corrupt or truncated image") and rows[1]["predicted_class"] == ""
    assert [row["true_class"] for row in rows] == ["cat", "cat", "dog", "dog"]
    assert all(row["predicted_class"] for row in rows if not row["error"])


def test_predict_gives_every_odd_entry_its_row_and_names_folders_that_match_no_class(trained, tmp_path, caplog):
    import os

    data, run_dir = trained
    folder = tmp_path / "images"
    for name in ("cat/a.png", "dgo/b.png"):  # dgo: a misspelt dog
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(folder / name)
    Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(os.fsdecode(bytes(folder / "cat") + b"/caf\xe9.png"))
    (folder / "cat" / "gone.png").symlink_to(folder / "nowhere.png")
    (folder / "cat" / "loop.png").symlink_to(folder / "cat" / "loop.png")
    os.mkfifo(folder / "cat" / "pipe.png")
    output = tmp_path / "out.csv"
    overrides = [*cifar_overrides(data), "mode=predict", f"checkpoint={run_dir}", f"predict.input={folder}"]
    with caplog.at_level("WARNING"):
        _task([*overrides, f"predict.output={output}"], tmp_path / "r")
    rows = {row["id"]: row for row in csv_rows(output)}
    assert set(rows) == {"cat/a.png", "cat/caf\\xe9.png", "cat/gone.png", "cat/loop.png", "cat/pipe.png", "dgo/b.png"}
    assert rows["cat/caf\\xe9.png"]["predicted_class"] and not rows["cat/caf\\xe9.png"]["error"]
    assert rows["cat/gone.png"]["error"] == "broken symlink"
    assert rows["cat/loop.png"]["error"] == "symlink loop"
    assert rows["cat/pipe.png"]["error"] == "a FIFO"
    assert "dgo/ match no class of the model" in caplog.text and "cat/" not in caplog.text.split("match no class")[0]


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_checkpoint", "no such file or run folder"),
        ("folder_without_checkpoint", "holds no checkpoints/best.keras"),
        ("other_class_names", r"trained on classes \['airplane', .*'truck'\] but predict.input .* has \['plane', "),
        ("old_checkpoint", "was saved by an older vggtrain"),
        ("glob_matches_nothing", "matches no file"),
        ("output_not_writable", "cannot write there"),
        ("no_checkpoint_given", "checkpoint must be"),
    ],
)
def test_bad_input_is_a_clear_error(trained, tmp_path, case, message):
    data, run_dir = trained
    checkpoint, mode, extra = run_dir, "predict", [f"predict.input={data}/test_batch.bin"]
    if case == "missing_checkpoint":
        checkpoint = tmp_path / "nope.keras"
    elif case == "folder_without_checkpoint":
        checkpoint = tmp_path
    elif case == "other_class_names":
        extra.append("dataset.class_names=[plane,car,bird,cat,deer,dog,frog,horse,ship,truck]")
    elif case == "old_checkpoint":
        checkpoint = tmp_path / "old.keras"
        keras.Sequential([keras.Input((28, 28, 3)), keras.layers.Flatten(), keras.layers.Dense(10)]).save(checkpoint)
    elif case == "glob_matches_nothing":
        extra = [f"predict.input={tmp_path}/*.bin"]
    elif case == "output_not_writable":
        (tmp_path / "file").write_text("x")
        extra += [f"predict.output={tmp_path}/file/out.csv"]
    overrides = [*cifar_overrides(data), f"mode={mode}", *extra]
    if case != "no_checkpoint_given":
        overrides.append(f"checkpoint={checkpoint}")
    before = {path: path.read_bytes() for path in (run_dir / "checkpoints").iterdir()}
    with pytest.raises((DataError, ConfigError), match=message):
        _task(overrides, tmp_path / "run")
    # Nothing already written is lost: the run's checkpoints are untouched, and no partial CSV is left behind.
    assert {path: path.read_bytes() for path in (run_dir / "checkpoints").iterdir()} == before
    assert not (run_dir / "predictions.csv").exists() and not list(tmp_path.rglob("*.csv"))


def test_mode_must_be_known():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as raised:  # an enum: refused when the config is composed
        to_settings(compose(["mode=serve"]))
    assert "expected one of [train, evaluate, predict, inspect, export]" in str(raised.value.__cause__)


def test_the_validation_split_is_checked_only_where_it_is_read(trained, tmp_path):
    """dataset.val_size=5000 (CIFAR's default) on an 80-record folder: only a mode reading val stops on it."""
    data, run_dir = trained
    too_big = "dataset.val_size=5000"
    metrics = _evaluate(data, run_dir, tmp_path / "test", too_big)
    assert metrics["split"] == "test" and metrics["num_examples"] == 24
    assert "temperature" not in metrics, "the test records stand in for val: no temperature fitted on the test split"
    _task([*cifar_overrides(data), too_big, "mode=inspect", "inspect.num_images=4"], tmp_path / "inspect")
    assert json.loads((tmp_path / "inspect" / "inspect.json").read_text())["num_examples"] == 80
    with pytest.raises(DataError, match=r"dataset.val_size=5000 must be between 1 and the 80 training records"):
        _evaluate(data, run_dir, tmp_path / "val", too_big, "evaluate.split=val")


def test_val_size_as_a_fraction(trained, tmp_path):
    data, run_dir = trained
    metrics = _evaluate(data, run_dir, tmp_path / "val", "dataset.val_size=0.25", "evaluate.split=val")
    assert metrics["num_examples"] == 20, "a quarter of the 80 training records"


def test_no_csv_cell_is_a_spreadsheet_formula(tmp_path):
    """Class and file names are user data: one that a spreadsheet would run (CSV injection) is written as text."""
    from tiny_model import build

    from trainer.models.preprocessing import build_models
    from trainer.runs import checkpoints
    from trainer.tracking.reports import write_confusion_csv

    names = ("=cmd|' /C calc'!A0", "+plus", "-minus", "@at", "\tTab", "\rReturn", "plain")
    checkpoint = tmp_path / "model.keras"
    model = build_models(build(len(names), (16, 16, 3))).inference
    checkpoints.save(model, checkpoint, checkpoints.ModelInfo(names, 16, 16, "standardize"))
    folder = tmp_path / "images"
    for name in ("=1+2.png", "@SUM(A1).png", "ok.png"):
        (folder / "=HYPERLINK(x)").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(folder / "=HYPERLINK(x)" / name)
    output = tmp_path / "out.csv"
    overrides = ["mode=predict", f"checkpoint={checkpoint}", f"predict.input={folder}", f"predict.output={output}"]
    _task(overrides, tmp_path / "r")
    write_confusion_csv(tmp_path / "confusion.csv", np.eye(len(names), dtype=int), list(names))
    for path in (output, tmp_path / "confusion.csv"):
        with open(path, newline="", encoding="utf-8") as handle:
            cells = [cell for row in csv.reader(handle) for cell in row]
        assert not [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")], path.name
    rows = csv_rows(output)
    assert [row["id"] for row in rows] == [
        "'=HYPERLINK(x)/=1+2.png",
        "'=HYPERLINK(x)/@SUM(A1).png",
        "'=HYPERLINK(x)/ok.png",
    ]
    assert all(row["predicted_class"].lstrip("'") in names for row in rows)
    assert "OWASP" in (ROOT / "docs" / "workflows.md").read_text(), "the docs say what is done to such cells"
