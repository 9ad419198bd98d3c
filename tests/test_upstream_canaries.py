"""Canaries: each test reproduces an upstream bug we work around, with the library alone (never our workaround),
and asserts that the bug is still there. A failing canary is good news: upstream fixed it, and its message names
the workaround to remove together with the canary. The ledger is the table "Workarounds of upstream bugs" in
docs/development.md; tests/test_compat.py and tests/test_training_options.py hold the other canaries it names."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, SUBPROCESS_ENV

# --- tf.data: destroying an iterator waits for the autotune model thread -----------------------------------------


def _seconds_to_destroy(after: float) -> float:
    """How long deleting an autotuned iterator takes once it has run `after` seconds."""
    dataset = tf.data.Dataset.range(1 << 40).map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
    iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
    next(iterator)
    start = time.monotonic()
    while time.monotonic() - start < after:
        next(iterator)
    start = time.monotonic()
    del iterator
    return time.monotonic() - start


@pytest.mark.unit
@pytest.mark.slow  # timing-based: kept out of the default suite, where a loaded CI machine could blur it
def test_tf_data_iterator_destruction_still_waits_out_the_autotune_model_thread():
    # The model thread sleeps 10, 20, 40 ... ms between optimizations; deleted just after one of its sleeps began,
    # the iterator waited for that sleep to end. A few tries: the wait does not come every time.
    waits = []
    for after in (0.15, 0.32, 0.65, 1.3) * 2:
        waits.append((after, round(_seconds_to_destroy(after), 3)))
        if waits[-1][1] >= after / 2:
            return
    pytest.fail(
        f"upstream fixed the iterator destruction that slept out tf.data's autotune period (seen in TF 2.21), "
        f"waits {waits}: remove `options.autotune.enabled = False` in trainer/data/pipeline.py (and its copies in "
        f"trainer/data/images.py, trainer/data/predict_inputs.py) and this canary"
    )


# --- Keras: compile's own LossScaleOptimizer is not in the compile config ----------------------------------------


@pytest.mark.unit
def test_keras_compile_config_still_drops_the_loss_scale_optimizer_it_wraps(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")  # Keras wraps the Adam itself
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        model.optimizer.build(model.trainable_variables)
        model.save(tmp_path / "model.keras")
    finally:
        keras.mixed_precision.set_global_policy("float32")  # a float32 process loads it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(tmp_path / "model.keras")
    skipped = [str(warning.message) for warning in caught if "Skipping variable loading" in str(warning.message)]
    assert skipped and not isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer), (
        f"upstream fixed the compile config that named the bare optimizer under mixed_float16 (Keras "
        f"{keras.__version__} loads {type(loaded.optimizer).__name__}, skipped: {skipped}): the hand-wrapped "
        f"LossScaleOptimizer in trainer/training/compiling.py::compile_model can go, and this canary"
    )


# --- Keras: no step state built before the first trace without a strategy ----------------------------------------


class _CountingModel(keras.Sequential):
    """Counts the traces of its training step (a Python call of `train_step` is one trace)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.traces = 0

    def train_step(self, data):
        self.traces += 1
        return super().train_step(data)


def _traces_of_one_fit(prebuild: bool) -> int:
    model = _CountingModel([keras.Input((3,)), keras.layers.Dense(2)], name="counting")
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32)
    if prebuild:  # what trainer/training/tracing.py does, with public calls
        model.compute_metrics(x, y, model(x))
        model.reset_metrics()
        model.optimizer.build(model.trainable_variables)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    return model.traces


@pytest.mark.unit
def test_keras_still_traces_the_first_training_step_twice_without_a_strategy():
    assert _traces_of_one_fit(prebuild=True) == 1, "the count itself: one trace when nothing is left to build"
    traces = _traces_of_one_fit(prebuild=False)
    assert traces == 2, (
        f"upstream fixed the second trace of the first step under the default strategy ({traces} now: Keras "
        f"builds the optimizer's slots and the metrics first): remove build_step_state in "
        f"trainer/training/tracing.py (and its calls) and this canary"
    )


# --- Keras: CutMix weights the label by a fractional box ----------------------------------------------------------


@pytest.mark.unit
def test_keras_cutmix_label_weight_is_still_not_the_share_of_pixels_kept():
    layer = keras.layers.CutMix(seed=7, dtype="float32")
    images = np.zeros((16, 32, 32, 3), np.float32)
    transformation = layer.get_random_transformation(images, training=True)
    masks = np.asarray(transformation["batch_masks"])[..., 0]
    kept = 1.0 - masks.reshape(len(images), -1).mean(axis=1)  # the share of its own pixels each image keeps
    gap = float(np.abs(np.asarray(transformation["mix_weight"]) - kept).max())
    assert gap > 1e-3, (
        f"upstream fixed CutMix's label weight, now the share of pixels kept (largest gap {gap:.2g}): our box in "
        f"trainer/data/mixing.py::_boxes can go back to Keras's draw (mind its per-batch alpha), and this canary"
    )


# --- Hydra: a failed job's exception only in the private `_return_value` ------------------------------------------


@pytest.mark.unit
def test_hydra_job_return_still_keeps_a_failed_jobs_exception_private(capsys):
    from hydra.core.utils import JobReturn, JobStatus

    failure = RuntimeError("boom")
    job = JobReturn(overrides=["a=1"], status=JobStatus.FAILED, _return_value=failure)
    with pytest.raises(RuntimeError, match="boom"):
        job.return_value  # noqa: B018 (the property raises, and writes "Error executing job" on stderr)
    fields = {field.name for field in dataclasses.fields(JobReturn)}
    assert fields == {"overrides", "cfg", "hydra_cfg", "working_dir", "task_name", "status", "_return_value"}, (
        f"Hydra changed JobReturn ({sorted(fields)}): if it now gives a failed job's exception publicly, use that "
        f"in trainer/tracking/sweep.py::SweepSummary.on_job_end instead of `_return_value`, and update this canary"
    )


@pytest.mark.unit
def test_hydra_still_saves_the_run_folders_config_through_its_private_save_config_and_reports_its_error(tmp_path):
    import inspect

    from hydra.core import utils as hydra_utils
    from omegaconf import OmegaConf

    assert "_save_config(" in inspect.getsource(hydra_utils.run_job), (
        "Hydra's run_job no longer writes .hydra/ through _save_config: trainer/cli/hydra_files.py wraps nothing "
        "now; find what writes it and update both"
    )
    (tmp_path / "taken").write_text("")  # a file where the folder should be: the write fails
    with pytest.raises(OSError):  # not one line of Hydra's: run_and_report prints it with a traceback
        hydra_utils._save_config(OmegaConf.create({"a": 1}), "config.yaml", tmp_path / "taken")


# --- Keras: a failed save_weights leaves its HDF5 file open -------------------------------------------------------


class _DiskFillsHere(keras.layers.Layer):
    """A layer whose weights cannot be written, as on a full disk."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1],), initializer="zeros")

    def call(self, inputs):
        return inputs

    def save_own_variables(self, store):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.unit
def test_keras_save_weights_still_leaves_its_hdf5_file_open_when_writing_fails(tmp_path):
    import h5py

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), _DiskFillsHere()])
    path = tmp_path / "model.weights.h5"
    left_open = []
    try:
        model.save_weights(path)
    except OSError:
        left_open = [
            handle
            for handle in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
            if Path(os.fsdecode(handle.name)).name == path.name
        ]
    try:
        assert left_open, (
            "upstream fixed save_weights leaving its HDF5 file open when a write fails (Keras closes it now): "
            "remove _release_hdf5 (and its h5py.h5f.get_obj_ids) in trainer/runs/atomic.py and this canary"
        )
    finally:
        for handle in left_open:
            handle.close()


# --- TensorFlow: op determinism cannot be turned off publicly -----------------------------------------------------


@pytest.mark.unit
def test_tensorflow_still_has_no_public_switch_to_turn_op_determinism_off():
    from tensorflow.python.framework import config as tf_config

    assert hasattr(tf_config, "disable_op_determinism"), "the private switch tests/conftest.py uses is gone"
    modules = {"tf.config": tf.config, "tf.config.experimental": tf.config.experimental}
    public = [name for name, module in modules.items() if hasattr(module, "disable_op_determinism")]
    assert not public, (
        f"upstream added a public switch to turn op determinism off ({public[0]}.disable_op_determinism): use it "
        f"in tests/conftest.py instead of tensorflow.python, turn it off in "
        f"trainer/tasks/runtime.py::setup_determinism (no warning that it stays on), and remove this canary"
    )


# --- TensorFlow: a worker's error reaches its peers only through a private call ------------------------------------


@pytest.mark.unit
def test_tensorflow_still_reports_an_error_to_the_cluster_only_through_its_private_context():
    from tensorflow.python.eager import context

    assert hasattr(context.Context, "report_error_to_cluster"), (
        "the private call trainer/distribute/failures.py::errors_told_to_peers makes is gone: a worker's own error "
        "no longer stops its peers at once (they wait for a heartbeat); find its successor"
    )
    public = [name for name in dir(tf.distribute.experimental) if "report_error" in name.lower()]
    assert not public, (
        f"upstream added a public call ({public[0]}): use it in errors_told_to_peers and remove this canary"
    )


@pytest.mark.unit
def test_tensorflow_still_bounds_the_clusters_registration_only_through_its_private_context():
    import inspect

    from tensorflow.python.eager import context

    private = inspect.signature(context.Context.configure_coordination_service).parameters
    assert "cluster_register_timeout_in_ms" in private, (
        "the private call trainer/distribute/startup.py::register_within makes changed: a worker whose chief left "
        "while the cluster connected waits TensorFlow's hour again; find its successor"
    )
    options = [tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.CommunicationOptions]
    public = [name for option in options for name in inspect.signature(option).parameters if "regist" in name]
    assert not public, f"upstream added a public option ({public[0]}): use it in register_within, remove this canary"


# --- A collective with a timeout holds a sleeping thread for the whole timeout ------------------------------------


def _threads() -> int:
    return int(re.search(r"^Threads:\s+(\d+)", Path("/proc/self/status").read_text(), re.M)[1])


@pytest.mark.unit
def test_tensorflow_still_holds_a_thread_per_collective_for_its_whole_timeout():
    @tf.function
    def reduce(value, key, timeout):  # a one-member group: no peer needed
        return tf.raw_ops.CollectiveReduceV2(
            input=value,
            group_size=1,
            group_key=424242,  # its own group: a strategy of another test in this process may hold 1
            instance_key=key,
            ordering_token=[],
            merge_op="Add",
            final_op="Id",
            timeout_seconds=timeout,
        )

    grown = {}
    for timeout in (0.0, 20.0):
        before = _threads()
        for key in range(100):
            reduce(tf.constant([1.0]), tf.constant(key + 424242 + 1000 * int(timeout)), timeout)
        grown[timeout] = _threads() - before
    assert grown[0.0] < 20, grown
    assert grown[20.0] >= 100, (
        f"100 collectives with a 20 s timeout left {grown[20.0]} threads: upstream shares the timeout's watchdog "
        "now (base_collective_executor.cc); CommunicationOptions(timeout_seconds=...) may replace the step "
        "watchdog (trainer/distribute/watchdog.py), ledger row 16"
    )


@pytest.mark.unit
def test_kerass_synchronized_batch_norm_still_launches_three_all_reduces(monkeypatch):
    from keras.src.backend.tensorflow import nn

    from trainer.distribute import fused_moments

    if nn._compute_moments_sync is fused_moments._compute_moments_sync:
        pytest.skip("patched in this process")
    calls = []
    original = tf.distribute.ReplicaContext.all_reduce
    monkeypatch.setattr(
        tf.distribute.ReplicaContext, "all_reduce", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"], tf.distribute.ReductionToOneDevice())
    tf.function(lambda: strategy.run(lambda: nn._compute_moments_sync(tf.ones([2, 3, 3, 4]), [0, 1, 2], False)))()
    assert len(calls) == 3, (
        f"Keras's synchronized batch norm makes {len(calls)} all-reduce call(s) per layer now: if one, remove "
        "trainer/distribute/fused_moments.py and ledger row 17"
    )


# --- HDF5: a process that failed to write to a full disk crashes at exit --------------------------------------------

FULL_DISK_SAVE = """
import sys, keras
model = keras.Sequential([keras.Input((400,)), keras.layers.Dense(400), keras.layers.Dense(400)])  # 1.3 MB
try:
    model.save_weights(sys.argv[1])
except OSError:
    print("one error, then a normal exit", flush=True)
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_hdf5_still_crashes_the_process_at_exit_after_a_write_to_a_full_disk_failed(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        process = subprocess.run(
            [sys.executable, "-c", FULL_DISK_SAVE, str(disk / "model.weights.h5")],
            env=SUBPROCESS_ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert "one error" in process.stdout, process.stderr[-3000:]
    assert process.returncode == -signal.SIGSEGV, (
        f"upstream fixed the crash at exit after a failed HDF5 write to a full disk (h5py/h5py#914; exit code "
        f"{process.returncode} now): the hard exit in run.py::main and the in-memory writes of "
        f"trainer/runs/backup.py::save_weights can go (keep _release_hdf5 in trainer/runs/atomic.py while its own "
        f"canary holds), and this canary"
    )


# --- Optuna: a job opens its running trial through the storage and the trial's constructor -------------------

OPTUNA_STUDY_API = {  # Optuna 5.1's public Study: none of it opens a running trial by its number
    "add_trial", "add_trials", "ask", "best_params", "best_trial", "best_trials", "best_value", "direction",
    "directions", "enqueue_trial", "get_trials", "metric_names", "optimize", "set_metric_names", "set_user_attr",
    "stop", "tell", "trials", "trials_dataframe", "user_attrs",
}  # fmt: skip


@pytest.mark.unit
def test_optuna_still_opens_a_running_trial_of_another_process_only_through_its_internal_storage_calls(tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    where = "trainer/search/trial.py::connect"
    public = {name for name in dir(optuna.Study) if not name.startswith("_")}
    assert public == OPTUNA_STUDY_API, (
        f"Optuna's public Study changed ({sorted(public ^ OPTUNA_STUDY_API)}): if a new call opens a running trial "
        f"by its number, use it in {where} instead of the storage's ids and optuna.Trial(study, trial_id), and drop "
        f"the ledger's Optuna row with this canary; else add the names to OPTUNA_STUDY_API"
    )
    internal = "not supposed to be directly accessed by library users"
    assert internal in optuna.storages.BaseStorage.__doc__, (
        f"Optuna's BaseStorage is public now: {where} uses it as it is; drop the ledger's Optuna row and this canary"
    )
    assert "direct use of this constructor is not recommended" in " ".join(optuna.Trial.__doc__.split()), (
        f"optuna.Trial's constructor is public now: {where} uses it as it is; drop the ledger's Optuna row and this "
        f"canary"
    )
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))
    study = optuna.create_study(study_name="s", storage=storage)
    asked = study.ask()  # the sweep's trial; the job opens it in another process, as connect does
    study_id = storage.get_study_id_from_name("s")
    trial = optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, asked.number))
    trial.report(0.5, 0)
    assert study.get_trials(deepcopy=False)[0].intermediate_values == {0: 0.5}


# --- OmegaConf: a child node, as it is, only through the private `_get_node` --------------------------------------


@pytest.mark.unit
def test_omegaconf_still_gives_a_child_node_unresolved_only_through_its_private_get_node(monkeypatch):
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    where = "trainer/cli/arguments.py::_check_path"
    monkeypatch.delenv("VGGTRAIN_CANARY_UNSET", raising=False)
    section = OmegaConf.create({"lazy": "${oc.env:VGGTRAIN_CANARY_UNSET}", "missing": "???", "inner": {"key": 1}})
    nodes = [section._get_node(key)._value() for key in ("lazy", "missing")]
    assert nodes == ["${oc.env:VGGTRAIN_CANARY_UNSET}", "???"], (
        f"DictConfig._get_node, which {where} calls, no longer gives a child as it is ({nodes}): find its successor"
    )
    public = [name for kind in (OmegaConf, DictConfig) for name in dir(kind) if "node" in name and name[0] != "_"]
    assert not public, (
        f"upstream added a public call ({public[0]}): use it in {where}, drop ledger row 19 and this canary"
    )
    for read in (lambda: section.get("lazy"), lambda: section["missing"], lambda: OmegaConf.select(section, "lazy")):
        with pytest.raises((InterpolationResolutionError, MissingMandatoryValue)):
            read()  # else that public read gives a child as it is: use it in _check_path, drop row 19 and this canary


# --- Not upstream: vggtrain 0.2 removes the readers of 0.1's files and names (ledger rows 10, 11 and 13) ----------

REMOVED_IN_0_2 = {  # ledger row -> what goes when pyproject.toml's version reaches 0.2
    10: "trainer/config/legacy.py (its call in trainer/config/reuse.py::load_saved) and tests/test_config_legacy.py",
    11: "trainer/runs/checkpoints.py::_without_augmentation (its call in load) and its test in test_preprocessing.py",
    13: "`records` in trainer/config/fields.py::PredictFormat and trainer/data/predict_inputs.py::FORMAT_ALIASES",
}


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: 0.1.0 -> (0, 1), 0.2.0rc1 -> (0, 2)."""
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def _project_version() -> str:
    """The `version` of pyproject.toml's [project] table."""
    project = (ROOT / "pyproject.toml").read_text().split("[project]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)


@pytest.mark.unit
@pytest.mark.parametrize("row", sorted(REMOVED_IN_0_2))
def test_the_project_has_not_reached_the_release_that_removes_a_reader_of_0_1(row):
    version = _project_version()
    assert _release("0.2.0rc1") == (0, 2) and _release("0.10.3") == (0, 10), "the trigger can fire"
    assert _release(version) < (0, 2), (
        f"pyproject.toml says vggtrain {version}: ledger row {row} ends in 0.2. Remove {REMOVED_IN_0_2[row]}, the "
        f"row, and this row of REMOVED_IN_0_2"
    )


# --- Hydra: get_mode composes the whole config to read hydra.mode (hydra#3440) ------------------------------------


@pytest.mark.unit
def test_hydras_get_mode_still_composes_the_config_to_read_the_run_mode():
    import inspect

    from hydra._internal import utils as hydra_internal
    from hydra._internal.hydra import Hydra

    assert "compose_config(" in inspect.getsource(Hydra.get_mode) and "get_mode(" in inspect.getsource(
        hydra_internal._run_hydra
    ), (
        "Hydra no longer composes the config in get_mode before run() (hydra#3440 fixed): remove "
        "trainer/cli/hydra_mode.py, the mode check_composes returns, the ledger's row 20 and this canary"
    )


# --- TensorFlow: dropout in bfloat16 draws its uniform numbers in bfloat16, so it is biased ------------------------


@pytest.mark.unit
def test_tensorflow_dropout_in_bfloat16_still_keeps_fewer_units_than_its_rate_says():
    units = tf.ones([1000, 1000], tf.bfloat16)
    dropped = tf.cast(tf.nn.experimental.stateless_dropout(units, rate=0.3, seed=[1, 2]), tf.float64)
    kept, mean = float(tf.reduce_mean(tf.cast(dropped != 0, tf.float64))), float(tf.reduce_mean(dropped))
    assert abs(kept - 0.7) > 0.003 and abs(mean - 1.0) > 0.004, (  # 0.695 and 0.993 in TensorFlow 2.21
        f"TensorFlow's dropout in bfloat16 now keeps {kept:.4f} of the units at rate 0.3 (mean {mean:.4f}): "
        "unbiased, so trainer/models/vgg19.py::dropout_layer may compute in the policy's dtype again; drop ledger "
        "row 21 and this canary"
    )


# --- tf.data: a count assertion's error has no type of its own ------------------------------------------------------


@pytest.mark.unit
def test_tf_data_cardinality_error_is_still_told_only_by_its_message():
    """Ledger row 22: a read short of `assert_cardinality`'s count is a plain FailedPreconditionError, told by its
    message alone. If this fails, the message changed (update `trainer.data.module.CARDINALITY`) or a distinct
    error type exists (match it in `miscounted` instead)."""
    from trainer.data.module import CARDINALITY

    short = tf.data.Dataset.range(3).apply(tf.data.experimental.assert_cardinality(5))
    with pytest.raises(tf.errors.FailedPreconditionError) as error:
        list(short)
    assert type(error.value) is tf.errors.FailedPreconditionError
    assert CARDINALITY in str(error.value.message), "the message changed: row 22's match no longer finds it"
