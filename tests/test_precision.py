"""Mixed precision is a training policy, not a deliverable: a run trained in `mixed_bfloat16` or `mixed_float16`
saves float32 models, records the precision it trained in, and exports in every format, each checked.

    python run.py trainer.precision=mixed_bfloat16 && python run.py mode=export checkpoint=RUN export.format=all
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import run_cli, tiny_overrides, write_cifar
from trainer.runs import checkpoints
from trainer.serving import bundle

MIXED = ["mixed_bfloat16", "mixed_float16"]


def _compute_dtypes(model: keras.Model) -> set[str]:
    """The compute dtypes of every layer of `model`, nested models included, but the uint8 input's."""
    found = set()
    for layer in model.layers:
        if not isinstance(layer, keras.layers.InputLayer):
            found.add(layer.compute_dtype)
        if isinstance(layer, keras.Model):
            found |= _compute_dtypes(layer)
    return found


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """`mixed_run(policy)`: (data folder, run folder, MLflow URI) of one tiny run of two epochs trained in
    `policy`, logged to MLflow with its model; made once per policy and module."""
    root = tmp_path_factory.mktemp("precision")
    data = write_cifar(root / "cifar", records_per_file=16, num_test=24)
    made: dict[str, tuple[Path, Path, str]] = {}

    def make(policy: str) -> tuple[Path, Path, str]:
        if policy not in made:
            run_dir, uri = root / policy, f"sqlite:///{root / policy}.db"
            typed = [*tiny_overrides(data), "trainer.epochs=2", f"trainer.precision={policy}", "logger=mlflow"]
            result = run_cli([*typed, f"logger.tracking_uri={uri}", f"hydra.run.dir={run_dir}"], cwd=root)
            keras.mixed_precision.set_global_policy("float32")
            assert result.returncode == 0, result.stderr[-3000:]
            made[policy] = data, run_dir, uri
        return made[policy]

    return make


@pytest.mark.integration
@pytest.mark.parametrize("policy", [MIXED[0], pytest.param(MIXED[1], marks=pytest.mark.slow)])
def test_a_mixed_run_saves_float32_models_and_records_its_precision(mixed_run, policy):
    """best.keras and last.keras computed in the training policy (ONNX Runtime refused their bfloat16 Conv);
    they are float32 models now, with the weights the run trained, and vggtrain.json names the policy."""
    _, run_dir, _ = mixed_run(policy)
    for name in ("best.keras", "last.keras"):
        file = run_dir / "checkpoints" / name
        model = keras.saving.load_model(file, compile=False)
        assert _compute_dtypes(model) == {"float32"}, name
        assert checkpoints.read_info(file).precision == policy
        with zipfile.ZipFile(file) as archive:
            assert policy not in archive.read("config.json").decode(), "no layer names the training policy"


@pytest.mark.e2e
@pytest.mark.slow  # 2 x 60 s: every format of each policy, quantized too
@pytest.mark.parametrize("policy", MIXED)
def test_a_mixed_run_exports_in_every_format_and_as_an_mlflow_model(mixed_run, policy, tmp_path):
    import mlflow
    import pandas as pd

    data_dir, run_dir, uri = mixed_run(policy)
    for quantize in ("int8", "float16"):
        export_dir = tmp_path / quantize
        formats = "all" if quantize == "int8" else "litert"
        typed = ["mode=export", f"checkpoint={run_dir}", f"export.dir={export_dir}", f"export.format={formats}"]
        floor = ["export.int8_min_agreement=0"]  # a model of noise labels: its top-1 is a near tie (the floor's own
        # test: tests/test_export_targets.py); here each format's self-check is what is asserted
        result = run_cli([*typed, f"export.quantize={quantize}", "export.check_images=24", *floor])
        assert result.returncode == 0, result.stderr[-3000:]
        info = json.loads((export_dir / bundle.INFO_FILE).read_text())
        assert info["trained_precision"] == policy
        for entry in info["files"].values():
            assert entry["max_difference"] <= bundle.FLOAT_TOLERANCE
            assert entry["quantized"]["quantize"] == quantize if "quantized" in entry else True
    assert set(json.loads((tmp_path / "int8" / bundle.INFO_FILE).read_text())["files"]) == {
        "saved_model", "onnx", "litert", "openvino"
    }  # fmt: skip
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    images = np.random.default_rng(3).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    answer = loaded.predict(pd.DataFrame({"images": [image.tolist() for image in images]}))
    model = keras.saving.load_model(run_dir / "checkpoints" / "best.keras")
    expected = model.predict(images[:, 2:30, 2:30], verbose=0)  # the evaluation's centre crop of 28
    np.testing.assert_allclose(np.stack(answer["probabilities"]), expected, atol=1e-5)


def _earlier_bfloat16_checkpoint(path: Path) -> keras.Model:
    """A checkpoint as vggtrain saved one trained in mixed_bfloat16 before it saved float32 models: the layers
    name the training policy. Returns the float32 model with the same weights."""
    from trainer.models.preprocessing import build_models

    def build() -> keras.Model:
        inputs = keras.Input((16, 16, 3))
        x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
        x = keras.layers.BatchNormalization(name="bn")(x)
        x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
        outputs = keras.layers.Dense(3, activation="softmax", dtype="float32", name="predictions")(x)
        return build_models(keras.Model(inputs, outputs, name="tiny"), "standardize").inference

    keras.utils.set_random_seed(0)
    reference = build()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = build()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    mixed.set_weights(reference.get_weights())
    mixed.save(path)
    info = checkpoints.ModelInfo(("a", "b", "c"), 16, 16, "standardize", decode="")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(checkpoints.INFO_ENTRY, info.to_json())
    return reference


@pytest.mark.integration
def test_a_bfloat16_checkpoint_of_an_earlier_vggtrain_loads_and_exports_as_float32(tmp_path, caplog):
    file = tmp_path / "model.keras"
    reference = _earlier_bfloat16_checkpoint(file)
    assert "mixed_bfloat16" in zipfile.ZipFile(file).read("config.json").decode()
    caplog.set_level(logging.INFO, logger="trainer.runs")
    model, info = checkpoints.load(file)
    assert f"{file} computes in mixed_bfloat16 (an earlier vggtrain saved it so): loaded as a float32" in caplog.text
    assert _compute_dtypes(model) == {"float32"} and info.precision == ""
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    np.testing.assert_array_equal(model.predict(images, verbose=0), reference.predict(images, verbose=0))
    export_dir = tmp_path / "serving"
    typed = ["mode=export", f"checkpoint={file}", f"export.dir={export_dir}", "export.format=onnx"]
    result = run_cli([*typed, "export.check_images=4", f"hydra.run.dir={tmp_path / 'e'}"])
    assert result.returncode == 0, result.stderr[-3000:]  # ONNX Runtime refused its bfloat16 Conv
    assert json.loads((export_dir / bundle.INFO_FILE).read_text())["trained_precision"] == "not recorded"


# --- trainer.precision=auto -----------------------------------------------------------------------------------

AMX, NO_BF16 = "AMX-BF16", ""


@pytest.mark.unit
@pytest.mark.parametrize(
    "requested, cpu, gpu, gflops, policy, reason",
    [
        ("auto", AMX, None, 39.0, "mixed_bfloat16", "CPU has AMX-BF16"),  # VGG19 at 224 px
        ("auto", AMX, None, 0.05, "float32", "CPU has AMX-BF16, but the model's 0.05 GFLOPs per image are below"),
        ("auto", "AVX512-BF16", None, 0.8, "mixed_bfloat16", "CPU has AVX512-BF16"),
        ("auto", NO_BF16, None, 39.0, "float32", "no native bfloat16 on this CPU"),
        ("auto", NO_BF16, (8, 0), 39.0, "mixed_bfloat16", "GPU of compute capability 8.0"),
        ("auto", NO_BF16, (7, 5), 39.0, "mixed_float16", "GPU of compute capability 7.5: float16 tensor cores"),
        ("auto", NO_BF16, (6, 1), 39.0, "float32", "GPU of compute capability 6.1: no half-precision"),
        ("auto", AMX, None, None, "mixed_bfloat16", "CPU has AMX-BF16"),  # before the model is counted
        ("float32", AMX, None, 39.0, "float32", "as set"),
        ("mixed_bfloat16", AMX, None, 0.01, "mixed_bfloat16", "as set"),  # forced: no rule applies
        ("mixed_float16", AMX, None, 39.0, "mixed_float16", "emulated on the CPU, slow"),
        ("mixed_bfloat16", NO_BF16, None, 39.0, "mixed_bfloat16", "emulated on this CPU, slower than float32"),
    ],
)
def test_precision_is_chosen_for_the_hardware_and_the_model(requested, cpu, gpu, gflops, policy, reason):
    from trainer.training.precision import Hardware, choose

    chosen, why = choose(requested, Hardware(cpu, gpu), gflops)
    assert chosen == policy and why.startswith(reason)


@pytest.mark.unit
def test_the_cpu_flags_name_its_native_bfloat16(tmp_path):
    from trainer.training.precision import cpu_bfloat16

    def flags(*names: str) -> Path:
        path = tmp_path / "cpuinfo"
        path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {' '.join(names)}\nbogomips\t: 1\n")
        return path

    assert cpu_bfloat16(flags("avx512f", "avx512_bf16", "amx_tile", "amx_bf16")) == "AMX-BF16"
    assert cpu_bfloat16(flags("avx512f", "avx512_bf16")) == "AVX512-BF16"
    assert cpu_bfloat16(flags("avx512f")) == "" and cpu_bfloat16(tmp_path / "missing") == ""


@pytest.mark.unit
def test_the_flops_rule_keeps_the_demo_in_float32_and_full_width_vgg19_in_bfloat16():
    """The rule the benchmark backs (benchmarks/precision.py): the demo's VGG19 (width 0.25, 32 px) trains slower
    in bfloat16 on a CPU with native bfloat16, full width faster from 32 px on."""
    from trainer.models.vgg19 import build_vgg19
    from trainer.training.precision import MIN_GFLOPS_PER_IMAGE, gflops_per_image

    demo = gflops_per_image(build_vgg19(10, (32, 32, 3), width_multiplier=0.25, fc_units=512))
    full = gflops_per_image(build_vgg19(10, (32, 32, 3), width_multiplier=1.0, fc_units=512))
    assert demo == pytest.approx(0.0505, rel=0.01) and demo < MIN_GFLOPS_PER_IMAGE < full
    assert full == pytest.approx(0.797, rel=0.01)  # 2 x 0.4 G multiply-adds: VGG19's 19.5 G at 224 x (32/224)^2


@pytest.mark.integration
@pytest.mark.slow  # two runs; the rule itself is the unit tests' above
def test_auto_logs_its_choice_and_a_model_too_small_trains_as_float32_would(tmp_path, cifar_dir, monkeypatch):
    """On a CPU with AMX-BF16 the tiny network is too small to gain: auto builds it in mixed_bfloat16, counts it,
    and sets it back to float32; then it trains to the weights a float32 run gets, bit for bit."""
    from trainer.training import precision

    monkeypatch.setattr(precision, "detect_hardware", lambda: precision.Hardware(cpu_bfloat16="AMX-BF16"))
    shas, logs = {}, ""
    for policy in ("auto", "float32"):
        run_dir = tmp_path / policy
        result = run_cli([*tiny_overrides(cifar_dir), f"trainer.precision={policy}", f"hydra.run.dir={run_dir}"])
        assert result.returncode == 0, result.stderr[-3000:]
        shas[policy] = json.loads((run_dir / "metrics.json").read_text())["weights_sha256"]
        logs += result.stdout + result.stderr
    assert shas["auto"] == shas["float32"]
    assert "Precision float32 (CPU has AMX-BF16, but the model's " in logs and "<trainer.precision=auto>" in logs
    assert "Precision float32 (as set) <trainer.precision=float32>" in logs


def _spy_on_builds(monkeypatch) -> list[str]:
    """The global policy at each build of the run's network (trainer.tasks.train.build_network)."""
    from trainer.tasks import train

    policies, build = [], train.build_network

    def spied(*args, **kwargs):
        policies.append(keras.mixed_precision.global_policy().name)
        return build(*args, **kwargs)

    monkeypatch.setattr(train, "build_network", spied)
    return policies


@pytest.mark.integration
def test_auto_builds_a_model_too_small_to_gain_in_float32_only(tmp_path, cifar_dir, monkeypatch):
    """Built in mixed_bfloat16 and set back to float32, the demo's network computed the same but stepped ~9%
    slower than built in float32: auto counts the network built in float32 and keeps that build."""
    from trainer.training import precision

    monkeypatch.setattr(precision, "detect_hardware", lambda: precision.Hardware(cpu_bfloat16="AMX-BF16"))
    builds = _spy_on_builds(monkeypatch)
    result = run_cli([*tiny_overrides(cifar_dir), "trainer.steps_per_epoch=1", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert builds == ["float32"]
    assert "Precision float32 (CPU has AMX-BF16, but the model's " in result.stdout + result.stderr


@pytest.mark.integration
@pytest.mark.slow  # two runs
def test_auto_builds_a_model_that_gains_again_in_bfloat16_with_the_weights_a_forced_run_draws(
    tmp_path, cifar_dir, monkeypatch
):
    from trainer.training import precision

    monkeypatch.setattr(precision, "detect_hardware", lambda: precision.Hardware(cpu_bfloat16="AMX-BF16"))
    monkeypatch.setattr(precision, "gflops_per_image", lambda model: 39.0)  # VGG19 at 224 px
    builds = _spy_on_builds(monkeypatch)
    shas = {}
    for policy in ("auto", "mixed_bfloat16"):
        run_dir = tmp_path / policy
        result = run_cli([*tiny_overrides(cifar_dir), f"trainer.precision={policy}", f"hydra.run.dir={run_dir}"])
        assert result.returncode == 0, result.stderr[-3000:]
        shas[policy] = json.loads((run_dir / "metrics.json").read_text())["weights_sha256"]
    assert builds == ["float32", "mixed_bfloat16", "mixed_bfloat16"]
    assert shas["auto"] == shas["mixed_bfloat16"]


@pytest.mark.integration
def test_mixed_float16_on_a_cpu_is_one_warning_not_an_error(tmp_path, cifar_dir):
    run_dir = tmp_path / "run"
    result = run_cli([*tiny_overrides(cifar_dir), "trainer.precision=mixed_float16", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in (result.stdout + result.stderr).splitlines() if "] - Precision " in line]
    assert "[WARNING] - Precision mixed_float16 (emulated on the CPU, slow" in line
