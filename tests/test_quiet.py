"""TensorFlow's start-up noise stays out of the console (`trainer.quiet`); the converter is quiet too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_cats_dogs import make_pets

from conftest import ROOT, SUBPROCESS_ENV, tiny_overrides, write_cifar
from trainer.quiet import NOISE, drop_noise, filtered_stderr

NOISY = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1796069454.731711   28459 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n"
    "I0000 00:00:1796069454.957184   28459 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.\n"
    "E0000 00:00:1796068541.575825    5267 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
)


@pytest.mark.unit
def test_noise_lines_go_and_other_lines_stay():
    assert drop_noise(NOISY + "a real problem\n") == "a real problem\n"
    assert drop_noise("F0000 00:00:1.5   1 check.cc:1] Check failed\n") != "", "fatal lines stay"


@pytest.mark.unit
def test_what_cpp_writes_to_stderr_is_filtered(capfd):
    with filtered_stderr():
        os.write(2, (NOISY + "kept line\n").encode())
    assert capfd.readouterr().err == "kept line\n"


@pytest.mark.e2e
def test_the_converter_prints_no_tensorflow_noise(tmp_path):
    make_pets(tmp_path / "in", per_class=2)
    command = [sys.executable, "-m", "trainer.convert", str(tmp_path / "in"), str(tmp_path / "out"), "--image-size=16"]
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [line for line in result.stderr.splitlines() if NOISE.match(line) or "cuInit" in line], result.stderr
    assert "Wrote {'train': " in result.stderr


@pytest.mark.e2e
def test_a_resume_prints_no_tensorflow_noise(tmp_path):
    """A resume's modules imported TensorFlow before the quiet set-up: its banner reached the console."""
    run_dir = tmp_path / "run"
    (run_dir / "backup").mkdir(parents=True)  # a run folder with no epoch done
    # A value refused once the run's config is bound: the resume's modules are imported, nothing trains.
    command = [sys.executable, str(ROOT / "run.py"), f"resume={run_dir}", "trainer.epochs=0"]
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("error: trainer.epochs")
    assert not [line for line in result.stderr.splitlines() if NOISE.match(line) or "cuInit" in line], result.stderr


@pytest.mark.e2e
@pytest.mark.slow  # two joblib jobs in their own processes: ~25 s
def test_a_joblib_sweep_prints_no_tensorflow_noise(tmp_path):
    """The sweep's own process imports TensorFlow only at the end (the HParams summary), after the jobs ran in
    joblib's workers: that import printed the banner and the cuInit line."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    data = write_cifar(tmp_path / "cifar")
    command = [sys.executable, str(ROOT / "run.py"), "-m", *tiny_overrides(data), "launcher=joblib",
               "optimizer.lr=0.1,0.01", f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    env = {key: value for key, value in SUBPROCESS_ENV.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Sweep summary: 2 jobs, 0 failed" in result.stdout
    assert not [line for line in result.stderr.splitlines() if NOISE.match(line) or "cuInit" in line], result.stderr


@pytest.mark.e2e
@pytest.mark.slow  # a one-trial search in its own process: ~20 s
def test_a_search_on_a_database_prints_no_alembic_lines(tmp_path):
    """Optuna's RDBStorage sets its database up through alembic, which logs `setup plugin ...` at INFO."""
    pytest.importorskip("optuna")
    data = write_cifar(tmp_path / "cifar")
    command = [sys.executable, str(ROOT / "run.py"), "-m", *tiny_overrides(data), "hparams_search=vgg19_optuna",
               "hydra.sweeper.n_trials=1", f"hydra.sweeper.storage=sqlite:///{tmp_path / 'study.db'}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=SUBPROCESS_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "study.db").is_file()
    assert "alembic" not in result.stdout + result.stderr


@pytest.mark.unit
def test_the_mlflow_model_class_is_made_without_mlflows_type_hint_warning():
    """MLflow warns, in colour, on every import of a PythonModel whose `predict` has no type hints: the watcher
    (mode=evaluate evaluate.watch=true logger=mlflow), training and `mlflow models serve` printed it. The module
    is executed afresh here, as a new process imports it."""
    import importlib.util
    import warnings

    pytest.importorskip("mlflow")
    path = ROOT / "trainer" / "serving" / "mlflow_model.py"
    spec = importlib.util.spec_from_file_location("mlflow_model_imported_again", path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert [str(warning.message) for warning in caught if "type hint" in str(warning.message)] == []


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.mark.unit
def test_the_collector_is_paused_in_the_block_and_on_after_with_its_objects_frozen():
    import gc
    import weakref

    from trainer.quiet import collector_paused

    garbage = _Cycle()
    gone = weakref.ref(garbage)
    del garbage  # a cycle only the collector frees: collected before the freeze, not kept for good
    frozen = gc.get_freeze_count()
    try:
        with collector_paused():
            assert not gc.isenabled()
            made = [_Cycle() for _ in range(1000)]
        assert gc.isenabled()
        assert gone() is None, "garbage made before the block is collected, not frozen"
        assert gc.get_freeze_count() >= frozen + len(made), "what the block made is out of the collector's reach"
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled(), "a collector the caller turned off stays off"
    finally:
        gc.enable()
        gc.unfreeze()


@pytest.mark.integration
def test_tensorflow_is_imported_once_with_the_collector_paused_and_left_on():
    """run.py's first import of TensorFlow and Keras (`quiet.import_tensorflow`): the collector's full passes over
    the ~0.8 M objects it makes were 0.8 s of a 4 s import (`python -m benchmarks --only startup`)."""
    script = (
        "import gc, sys\n"
        "from trainer import quiet\n"
        "quiet.import_tensorflow()\n"
        "print(gc.isenabled(), 'keras' in sys.modules, gc.get_freeze_count())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    enabled, keras, frozen = result.stdout.split()
    assert (enabled, keras) == ("True", "True")
    assert int(frozen) > 100_000, "TensorFlow's and Keras's objects are frozen"
