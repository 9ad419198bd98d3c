"""Experiment trackers against the real thing: an MLflow server, MLflow's SQLite store, W&B offline files,
a multirun's MLflow parent run and TensorBoard HParams. Needs the [track] extra (in [test])."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, cifar_overrides, compose, csv_rows, tiny_overrides
from trainer.config import to_settings
from trainer.errors import ConfigError
from trainer.tasks.train import train

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

ARTIFACTS = {"metrics.json", "curves.png", "confusion_matrix_test.png", "checkpoints/best.keras",
             "report/report.html", "report/mistakes.png", "report/per_class.csv"}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(cifar_dir: Path, run_dir: Path, *extra: str) -> dict:
    """Two epochs of the three-layer test model (the trackers are the point), named and tagged."""
    overrides = [*tiny_overrides(cifar_dir), "trainer.epochs=2", "name=tracked", "tags=[smoke,ci]", *extra]
    overrides.append("evaluate.report=true")  # the report's files and figures reach the tracker
    train(to_settings(compose(overrides, run_dir)))
    return json.loads((run_dir / "metrics.json").read_text())


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def _check_run(client: MlflowClient, metrics: dict) -> None:
    (run,) = client.search_runs([client.get_experiment_by_name("vggtrain").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.params["trainer.epochs"] == "2" and run.data.params["model._target_"] == "tiny_model.build"
    assert run.data.tags["smoke"] == "true" and run.data.tags["tags"] == "smoke,ci"
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        assert [entry.step for entry in client.get_metric_history(run.info.run_id, name)] == [1, 2], name
    assert run.data.metrics["final/test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert run.data.metrics["final/test_ece"] == pytest.approx(metrics["test_ece"]), "the report's calibration"
    assert run.data.metrics["final/test_f1/cat"] == pytest.approx(metrics["test_per_class"]["cat"]["f1"])
    assert ARTIFACTS <= _artifacts(client, run.info.run_id)


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination", str(tmp_path / "server-artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            assert process.poll() is None, "mlflow server exited"
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)
    yield url
    os.killpg(process.pid, 15)
    process.wait(timeout=30)


@pytest.mark.e2e
@pytest.mark.slow  # the server takes ~10-70 s to start on a busy machine
def test_mlflow_server_gets_one_run_with_params_metrics_and_artifacts(tmp_path, cifar_dir, mlflow_server):
    metrics = _train(cifar_dir, tmp_path / "run", "logger=mlflow", f"logger.tracking_uri={mlflow_server}")
    _check_run(MlflowClient(tracking_uri=mlflow_server), metrics)
    assert metrics["name"] == "tracked" and metrics["tags"] == ["smoke", "ci"]


@pytest.mark.integration
def test_mlflow_default_is_an_embedded_sqlite_database_in_outputs(tmp_path, cifar_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "outputs" / "run"
    metrics = _train(cifar_dir, run_dir, "logger=[tensorboard,mlflow]")
    database = tmp_path / "outputs" / "mlflow.db"
    assert database.is_file()
    # Logging the model points MLflow's global URI at the run's store for a moment, and leaves it as it was:
    # it left MLFLOW_TRACKING_URI=<launch folder>/mlflow.db, where the next run of the process then logged.
    assert "MLFLOW_TRACKING_URI" not in os.environ and not mlflow.is_tracking_uri_set()
    assert not (tmp_path / "mlflow.db").exists()
    _check_run(MlflowClient(tracking_uri=f"sqlite:///{database}"), metrics)
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    assert _tensorboard_texts(run_dir / "tensorboard" / "train") == {"run/name": "tracked", "run/tags": "smoke, ci"}


def _tensorboard_texts(log_dir: Path) -> dict[str, str]:
    import tensorflow as tf

    texts = {}
    for events in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    texts[value.tag] = tf.make_ndarray(value.tensor).item().decode()
    return texts


@pytest.mark.integration
def test_mlflows_own_environment_variable_wins_over_our_default_and_the_log_names_it(tmp_path, monkeypatch, caplog):
    from trainer.tracking.loggers import MLflowTracker

    database = tmp_path / "theirs" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    tracker = MLflowTracker(None, "pets")
    with caplog.at_level("INFO"):
        tracker.connect()
    assert database.is_file()
    assert f"MLflow: experiment 'pets' at sqlite:///{database} <MLFLOW_TRACKING_URI>" in caplog.text
    assert MLflowTracker(f"sqlite:///{tmp_path}/ours.db", "pets").uri == f"sqlite:///{tmp_path}/ours.db", "a key wins"


@pytest.mark.unit
@pytest.mark.parametrize(
    "options, message",
    [
        ({"tracking_uri": "file:///tmp/mlruns"}, "logger.tracking_uri=file:///tmp/mlruns: MLflow's file store is in"),
        ({"tracking_uri": "mlruns"}, "logger.tracking_uri=mlruns: MLflow's file store is in maintenance mode"),
        ({"register_model": "a/b c"}, "logger.register_model='a/b c': a registered model's name must be non-empty"),
        ({"register_model": " "}, "logger.register_model=' ': a registered model's name must be non-empty"),
    ],
)
def test_a_store_or_a_model_name_mlflow_would_refuse_later_is_one_line_at_start_up(options, message):
    from trainer.tracking.loggers import MLflowTracker

    with pytest.raises(ConfigError, match=re.escape(message)):
        MLflowTracker(**{"tracking_uri": f"sqlite:///{ROOT}/unused.db", "experiment": "pets", **options})


@pytest.mark.integration
def test_an_unreachable_server_is_one_error_before_training(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    dead = f"http://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=f"logger.tracking_uri={dead}: cannot use the MLflow tracking store"):
        _train(cifar_dir, run_dir, "logger=mlflow", f"logger.tracking_uri={dead}", "logger.timeout_seconds=3")
    assert time.monotonic() - started < 60
    assert not (run_dir / "history.csv").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.integration
def test_a_resumed_run_logs_into_the_same_tracked_run(tmp_path):
    from trainer.tracking.loggers import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = MLflowTracker(uri, "vggtrain")
    first.connect()
    run_id = first.start(run_dir, "resumable", [], {"seed": 1}, None)
    first.on_epoch_end(0, {"loss": 2.0})  # then the process dies: no finish
    second = MLflowTracker(uri, "vggtrain")
    second.connect()
    assert second.start(run_dir, "resumable", [], {"seed": 1}, None) == run_id
    second.on_epoch_end(1, {"loss": 1.0})
    second.finish({"test_accuracy": 0.5}, [], run_dir)
    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("vggtrain").experiment_id])) == 1
    assert [(entry.step, entry.value) for entry in client.get_metric_history(run_id, "loss")] == [(1, 2.0), (2, 1.0)]
    assert client.get_run(run_id).info.status == "FINISHED"


def _wandb_records(path: Path):
    """The protobuf records of a .wandb file (a LevelDB-style log: 32 KiB blocks of crc, length, type, bytes)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, chunks = path.read_bytes(), 32768, 7, []
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        left = block - position % block
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (kind == 0 and length == 0):
            position += left
            continue
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


@pytest.mark.integration
def test_wandb_offline_files_hold_the_metrics(tmp_path, cifar_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    _train(cifar_dir, run_dir, "logger=wandb")
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    history, run = [], None
    for record in _wandb_records(wandb_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            run = record.run
    assert run.display_name == "tracked" and list(run.tags) == ["smoke", "ci"]
    assert [row["epoch"] for row in history] == [1, 2]
    for row, expected in zip(history, csv_rows(run_dir / "history.csv"), strict=True):
        assert row["val_loss"] == pytest.approx(float(expected["val_loss"]), rel=1e-5)
    saved = {path.name for path in wandb_file.parent.glob("files/**/*")}
    assert {"metrics.json", "best.keras"} <= saved


@pytest.mark.e2e
@pytest.mark.slow
def test_an_mlflow_sweep_is_one_parent_with_a_child_per_job_and_tensorboard_hparams(tmp_path, cifar_dir):
    sweep_dir = tmp_path / "sweep"
    database = tmp_path / "mlflow.db"
    result = subprocess.run(
        [
            sys.executable, str(ROOT / "run.py"), "-m", *cifar_overrides(cifar_dir), "trainer.verbose=0",
            "logger=[tensorboard,mlflow]", f"logger.tracking_uri=sqlite:///{database}",
            "optimizer.lr=0.01,0.02", f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    runs = client.search_runs([client.get_experiment_by_name("vggtrain").experiment_id])
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {run.data.tags["mlflow.parentRunId"] for run in children} == {parents[0].info.run_id}
    assert sorted(run.data.params["optimizer.lr"] for run in children) == ["0.01", "0.02"]
    assert sorted(run.info.run_name for run in children) == ["0: optimizer.lr=0.01", "1: optimizer.lr=0.02"]
    assert "Creating initial MLflow database tables" not in result.stdout + result.stderr
    assert not any(key.startswith("final/") and key.endswith("name") for run in children for key in run.data.metrics)
    assert parents[0].info.status == "FINISHED" and "best_objective" in parents[0].data.metrics

    import tensorflow as tf
    from tensorboard.plugins.hparams import plugin_data_pb2

    sessions = {}
    for job in ("0", "1"):
        for events in (sweep_dir / job / "tensorboard").glob("events.out.tfevents.*"):
            for event in tf.compat.v1.train.summary_iterator(str(events)):
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name == "hparams" and value.tag.endswith("session_start_info"):
                        data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                        sessions[job] = data.session_start_info.hparams["optimizer.lr"].number_value
    assert sessions == {"0": pytest.approx(0.01), "1": pytest.approx(0.02)}
    assert list((sweep_dir / "tensorboard").glob("events.out.tfevents.*")), "the experiment's HParams config"


@pytest.mark.integration
def test_only_the_chief_logs(tmp_path, cifar_dir, monkeypatch):
    """A worker that is not the chief trains (and writes to a temporary folder) but creates no tracked run."""
    from trainer.distribute import topology

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(topology, "is_chief", lambda strategy: False)
    uri = f"sqlite:///{tmp_path / 'worker.db'}"
    settings = to_settings(compose([*tiny_overrides(cifar_dir), "logger=mlflow", f"logger.tracking_uri={uri}"]))
    settings.output_dir = str(tmp_path / "run")
    train(settings)
    assert not (tmp_path / "worker.db").exists(), "a non-chief worker must not open the tracking store"
    assert not (tmp_path / "run" / "tracking.json").exists()


def _tracked_model(tmp_path: Path, cifar_dir: Path) -> tuple[str, str, Path]:
    """(tracking URI, run id, run folder) of a two-epoch run whose best.keras is registered as `tiny`."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    _train(cifar_dir, run_dir, "logger=mlflow", f"logger.tracking_uri={uri}", "logger.register_model=tiny")
    return uri, json.loads((run_dir / "tracking.json").read_text())["mlflow"], run_dir


def _uint8_images(count: int = 5) -> np.ndarray:
    """Images at the stored CIFAR size (32), which serving resizes and centre-crops to the model's 28."""
    return np.random.default_rng(3).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def _base64_png(image: np.ndarray) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _expected(run_dir: Path, images: np.ndarray) -> np.ndarray:
    """What the test evaluation gives for `images`: the model on their centre 28x28 crop."""
    import keras

    return keras.saving.load_model(run_dir / "checkpoints" / "best.keras").predict(images[:, 2:30, 2:30], verbose=0)


@pytest.mark.integration
def test_the_best_checkpoint_is_an_mlflow_model_that_takes_pixels_and_files(tmp_path, cifar_dir, capsys):
    import pandas as pd
    from mlflow.exceptions import MlflowException

    uri, run_id, run_dir = _tracked_model(tmp_path, cifar_dir)  # trainer.verbose=0
    captured = capsys.readouterr()
    assert "━" not in captured.out, "no Keras progress bar while MLflow checks the logged model"
    assert "Downloading artifacts" not in captured.out + captured.err, "nor MLflow's download bars"
    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
        images = _uint8_images()
        expected = _expected(run_dir, images)
        class_names = loaded.metadata.metadata["class_names"]
        assert class_names[0] == "airplane"
        assert loaded.metadata.get_input_schema().input_names() == ["images", "image_bytes"]
        by_pixels = loaded.predict(pd.DataFrame({"images": [image.tolist() for image in images]}))
        by_files = loaded.predict(pd.DataFrame({"image_bytes": [_base64_png(image) for image in images]}))
        for answer in (by_pixels, by_files):
            np.testing.assert_allclose(np.stack(answer["probabilities"]), expected, atol=1e-5)
            assert list(answer["predicted_class"]) == [class_names[i] for i in expected.argmax(1)]
            np.testing.assert_allclose(answer["probability"], expected.max(1), atol=1e-5)
        mixed = loaded.predict(
            pd.DataFrame({"images": [images[0].tolist(), None], "image_bytes": [None, _base64_png(images[1])]})
        )
        np.testing.assert_allclose(np.stack(mixed["probabilities"]), expected[:2], atol=1e-5)
        empty = loaded.predict(pd.DataFrame({"image_bytes": pd.Series([], dtype=str)}))
        assert len(empty) == 0 and list(empty.columns) == [
            "predicted_index", "predicted_class", "probability", "probabilities"
        ]  # fmt: skip
        with pytest.raises(MlflowException, match="row 1: 'image_bytes' is not base64"):
            loaded.predict(pd.DataFrame({"image_bytes": [_base64_png(images[0]), "not base64!"]}))
        with pytest.raises(MlflowException, match="row 2: 'image_bytes' is not a JPEG, PNG, GIF, BMP or WebP image"):
            loaded.predict(pd.DataFrame({"image_bytes": [_base64_png(images[0]), None, "bm90IGFuIGltYWdl"],
                                         "images": [None, images[1].tolist(), None]}))  # fmt: skip
        with pytest.raises(MlflowException, match=r"row 0: 'images' must be pixels \[height, width, 3\]"):
            loaded.predict(pd.DataFrame({"images": [[[1, 2], [3, 4]]]}))
        (version,) = MlflowClient(tracking_uri=uri).search_model_versions("name='tiny'")
        assert version.run_id == run_id
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.integration
def test_a_request_mlflow_leaves_without_our_columns_or_with_float_pixels_is_a_400_naming_what_was_expected(
    trained_run, tmp_path
):
    """MLflow's signature drops the columns it does not name (`image`, `foo`, an unnamed list) before `predict`
    sees the request, which then answered 200 with no predictions; floats in [0, 1] were read as black."""
    import pandas as pd
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc import scoring_server

    from trainer.serving.mlflow_model import SIGNATURE, ImageClassifier

    _, run_dir = trained_run
    mlflow.pyfunc.save_model(
        tmp_path / "model", python_model=ImageClassifier(), signature=SIGNATURE, pip_requirements=["mlflow"],
        artifacts={"checkpoint": str(run_dir / "checkpoints" / "best.keras")},
    )  # fmt: skip
    loaded = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    image, file = _uint8_images(1)[0], _base64_png(_uint8_images(1)[0])
    no_column = r"gives neither column 'image_bytes' \(a base64 file\) nor 'images' \(uint8 pixels"
    floats = r"row 0: 'images' must hold whole numbers 0-255 \(uint8 pixels\); got fractions in 0-1"

    def invoke(payload: dict) -> tuple[int, str]:  # what `mlflow models serve` answers, in this process
        try:
            answer = scoring_server.invocations(json.dumps(payload), "application/json", loaded,
                                                loaded.metadata.get_input_schema())  # fmt: skip
        except MlflowException as error:
            return error.get_http_status_code(), error.message
        return answer.status, answer.response

    bad = {  # docs/models.md, "MLflow": a bad request is a 400 naming what was expected
        "the Hugging Face name": ({"dataframe_records": [{"image": file}]}, no_column),
        "an unknown column": ({"dataframe_split": {"columns": ["foo"], "data": [[file]]}}, no_column),
        "unnamed inputs": ({"inputs": [file]}, no_column),
        "unnamed instances": ({"instances": [file]}, no_column),
        "unnamed pixels": ({"inputs": [image.tolist()]}, no_column),
        "float pixels": ({"inputs": {"images": [(image / 255).tolist()]}}, floats),
        "an empty batch naming no column": ({"dataframe_records": []}, no_column),
    }
    for name, (payload, message) in bad.items():
        status, answer = invoke(payload)
        assert status == 400 and re.search(message, answer), (name, status, answer)
    with pytest.raises(MlflowException, match=no_column):
        loaded.predict(pd.DataFrame({"image": [file]}))
    with pytest.raises(MlflowException, match=floats):
        loaded.predict(pd.DataFrame({"images": [(image / 255).tolist()]}))
    assert invoke({"inputs": {"image_bytes": []}}) == (200, '{"predictions": []}')
    as_floats = loaded.predict(pd.DataFrame({"images": [image.astype(np.float64).tolist()]}))  # 0-255: fine
    as_uint8 = loaded.predict(pd.DataFrame({"images": [image.tolist()]}))
    np.testing.assert_allclose(np.stack(as_floats["probabilities"]), np.stack(as_uint8["probabilities"]))


def _post(port: int, payload: dict, deadline: float, process: subprocess.Popen) -> tuple[int, dict]:
    """(status, answer) of the server's /invocations for `payload`, waiting until `deadline` for it to start."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except OSError:
            assert process.poll() is None, "mlflow models serve exited"
            assert time.monotonic() < deadline, "mlflow models serve did not start"
            time.sleep(1)


@pytest.mark.e2e
@pytest.mark.slow  # `mlflow models serve` starts a server: ~10-60 s here
def test_mlflow_models_serve_answers_every_documented_request_form(tmp_path, cifar_dir):
    uri, run_id, run_dir = _tracked_model(tmp_path, cifar_dir)
    images = _uint8_images(3)
    expected = _expected(run_dir, images)
    pixels, files = [image.tolist() for image in images], [_base64_png(image) for image in images]
    forms = {  # docs/models.md, "MLflow"
        "dataframe_records, files": {"dataframe_records": [{"image_bytes": text} for text in files]},
        "dataframe_split, files": {"dataframe_split": {"columns": ["image_bytes"], "data": [[text] for text in files]}},
        "dataframe_records, pixels": {"dataframe_records": [{"images": image} for image in pixels]},
        "dataframe_split, pixels": {"dataframe_split": {"columns": ["images"], "data": [[image] for image in pixels]}},
        "instances, files": {"instances": [{"image_bytes": text} for text in files]},
        "instances, pixels": {"instances": [{"images": image} for image in pixels]},
        "inputs, files": {"inputs": {"image_bytes": files}},
        "inputs, pixels": {"inputs": {"images": pixels}},
    }
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"runs:/{run_id}/model", "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=tmp_path, env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        answers = {name: _post(port, payload, deadline, process) for name, payload in forms.items()}
        empty = _post(port, {"dataframe_split": {"columns": ["image_bytes"], "data": []}}, deadline, process)
        bad = _post(port, {"dataframe_records": [{"image_bytes": "bm90IGFuIGltYWdl"}]}, deadline, process)
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)
    for name, (status, answer) in answers.items():
        assert status == 200, (name, answer)
        probabilities = np.array([row["probabilities"] for row in answer["predictions"]])
        np.testing.assert_allclose(probabilities, expected, atol=1e-5, err_msg=name)
    assert empty == (200, {"predictions": []})
    assert bad[0] == 400 and "row 0: 'image_bytes' is not a JPEG, PNG, GIF, BMP or WebP image" in bad[1]["message"], bad
