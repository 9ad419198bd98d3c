"""The bad-input matrix: every entry point meets every kind of bad input with one clear line.

Each case must fail with a `UserError` (run.py prints it as one `error: ...` line
and exits 1; see the command-line cases at the end), name the file or key, and
leave what was already written untouched. Unreadable images are not errors:
the converter and predict skip them and report each one.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from hydra.errors import ConfigCompositionException
from PIL import Image
from test_cats_dogs import _classic_records
from test_config_reuse import _folder_run

from conftest import CONF, TINY_MODEL, cifar_overrides, compose, pattern_records, run_cli, tiny_overrides, write_cifar
from trainer.cli.overrides import check_composes
from trainer.convert import main as convert_main
from trainer.data import tfrecords
from trainer.data.folder_to_records import ConvertOptions, convert
from trainer.errors import UserError
from trainer.tasks import run_task

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(tmp_path_factory, trained_run):
    """Good CIFAR files (`cifar/`), good classic TFRecords and a trained run (`run/`), shared by every case."""
    root = tmp_path_factory.mktemp("world")
    data, run_dir = trained_run
    (root / "cifar").symlink_to(data)
    (root / "run").symlink_to(run_dir)
    _classic_records(root / "good.tfrecords", 16, 40)
    return root


def _fingerprint(folder: Path) -> dict[str, str]:
    """Every file below `folder` and below the folders its links point at, with its content's digest."""
    files = [path for entry in folder.iterdir() for path in [entry, *entry.resolve().rglob("*")]]
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(files) if path.is_file()}


def _pets_train(world: Path, train: Path | str) -> list[str]:
    """cats_dogs overrides training on `train`, validating and testing on the good file."""
    good = world / "good.tfrecords"
    return _pets(
        world, [f"dataset.train_files=[{train}]", f"dataset.val_files=[{good}]", f"dataset.test_files=[{good}]"]
    )


def _pets(root: Path, overrides: list[str]) -> list[str]:
    """The three-layer test model: a bad record found in training fails its first step, which VGG19 makes slow."""
    return [
        "dataset=cats_dogs",
        "dataset.stored_size=40",
        "dataset.image_size=32",
        *TINY_MODEL,
        "trainer.batch_size=8",
        *overrides,
    ]


def _tfrecord(path: Path, feature: dict) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _int(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _bytes(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def case_missing_data_folder(world, tmp):
    return ["dataset=cifar", f"dataset.data_dir={tmp / 'nowhere'}"], "nowhere"


def case_glob_matches_nothing(world, tmp):
    return _pets_train(world, f"{tmp}/none_*"), "none_* matches no file"


def case_zero_byte_file(world, tmp):
    cifar = write_cifar(tmp / "cifar")
    (cifar / "data_batch_3.bin").write_bytes(b"")
    return cifar_overrides(cifar), "data_batch_3.bin: the file is empty"


def case_truncated_bin(world, tmp):
    cifar = write_cifar(tmp / "cifar")
    with open(cifar / "test_batch.bin", "ab") as handle:
        handle.write(b"\x01" * 100)
    return cifar_overrides(cifar), "test_batch.bin: 49268 bytes is not a whole number of 3073-byte records"


def case_corrupted_tfrecord(world, tmp):
    data = bytearray((world / "good.tfrecords").read_bytes())
    data[len(data) // 2] ^= 0x55
    (tmp / "bad.tfrecords").write_bytes(bytes(data))
    return _pets_train(world, tmp / "bad.tfrecords"), "bad.tfrecords: corrupted or truncated TFRecord"


def case_wrong_image_length(world, tmp):
    _tfrecord(tmp / "short.tfrecords", {"label": _int(0), "img_raw": _bytes(bytes(300))})
    expected = "short.tfrecords: record 0 cannot be decoded: 'img_raw' holds 300 bytes"
    return _pets_train(world, tmp / "short.tfrecords"), expected


def case_missing_feature_key(world, tmp):
    _tfrecord(tmp / "keyless.tfrecords", {"label": _int(0), "image": _bytes(bytes(4800))})
    return _pets_train(world, tmp / "keyless.tfrecords"), "keyless.tfrecords: record 0 has no 'img_raw' feature"


def case_label_too_large_bin(world, tmp):
    cifar = write_cifar(tmp / "cifar")
    (cifar / "data_batch_2.bin").write_bytes(pattern_records(np.array([3, 12, 4])))
    return tiny_overrides(cifar), "data_batch_2.bin: record 1 has label 12"  # found after the first step


def _bad_label_tfrecord(label):
    def case(world, tmp):
        with tf.io.TFRecordWriter(str(tmp / "labels.tfrecords")) as writer:
            for value in (0, 1, label, 0, 1, 0, 1, 0):
                feature = {"label": _int(value), "img_raw": _bytes(bytes(4800))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        good = world / "good.tfrecords"
        message = f"labels.tfrecords: record 2 has label {label}, expected 0 to 1"
        return _pets(
            tmp,
            [
                f"dataset.train_files=[{good}]",
                f"dataset.val_files=[{tmp}/labels.tfrecords]",
                f"dataset.test_files=[{good}]",
            ],
        ), message

    return case


def _bad_image_records(path: Path, bad: int, image: bytes | None) -> None:
    """8 records of 40x40x3 bytes, but record `bad`: `image` as its img_raw (None: no img_raw at all)."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index in range(8):
            feature = {"label": _int(index % 2), "img_raw": _bytes(bytes(4800))}
            if index == bad:
                feature = {"label": _int(0)} if image is None else {"label": _int(0), "img_raw": _bytes(image)}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _bad_image_tfrecord(image: bytes | None, reason: str):
    def case(world, tmp):
        _bad_image_records(tmp / "images.tfrecords", 5, image)
        return _pets_train(world, tmp / "images.tfrecords"), f"images.tfrecords: record 5 cannot be decoded: {reason}"

    return case


def case_unknown_key(world, tmp):
    return ["model.dropuot=0.1"], "dropuot"


def case_wrong_type(world, tmp):
    return ["trainer.epochs=many"], "trainer.epochs"


def case_dropout_one(world, tmp):
    return ["model.dropout=1.0"], "model.dropout must be in [0, 1); got 1.0"


def case_batch_zero(world, tmp):
    return ["trainer.batch_size=0"], "trainer.batch_size must be >= 1; got 0"


def case_epochs_zero(world, tmp):
    return ["trainer.epochs=0"], "trainer.epochs must be >= 1; got 0"


def case_unknown_policy(world, tmp):
    return ["dataset.augment.policy=autoaugment"], "dataset.augment.policy"


def case_policy_magnitude_above_one(world, tmp):
    return ["dataset.augment.policy_magnitude=9"], "dataset.augment.policy_magnitude must be in (0, 1] or null; got 9"


def case_mix_prob_above_one(world, tmp):
    return ["dataset.augment.mix_prob=1.5"], "dataset.augment.mix_prob must be a probability in [0, 1]; got 1.5"


def case_negative_mixup_alpha(world, tmp):
    return ["dataset.augment.mixup_alpha=-0.2"], "dataset.augment.mixup_alpha must be >= 0 (0: off); got -0.2"


def case_ema_momentum_one(world, tmp):
    return ["optimizer.ema_momentum=1.0"], "optimizer.ema_momentum must be in (0, 1) or null; got 1.0"


def case_grad_accum_zero(world, tmp):
    return ["trainer.grad_accum_steps=0"], "trainer.grad_accum_steps must be >= 1 (1: off); got 0"


def case_grad_accum_longer_than_the_run(world, tmp):
    overrides = [*cifar_overrides(world / "cifar"), "trainer.epochs=3", "trainer.grad_accum_steps=100"]
    return overrides, "trainer.grad_accum_steps=100 is more than the 6 steps of the whole run"


def case_image_size_that_the_crop_ignores(world, tmp):  # trained a 28x28 model on 64x64 images' corners
    overrides = [*cifar_overrides(world / "cifar"), "dataset.image_size=64"]
    return overrides, "dataset.augment.crop_size must be at least half of the 64-pixel image it is cut from"


def case_unknown_tta(world, tmp):  # a Choice field: Hydra refuses it as it composes, run.py words the line
    return ["evaluate.tta=five_crop"], "evaluate.tta must be one of none, flip; got 'five_crop'"


def case_checkpoint_of_another_model(world, tmp):
    import keras

    from trainer.models.preprocessing import build_models
    from trainer.runs import checkpoints

    network = keras.Sequential([keras.Input((28, 28, 3)), keras.layers.Flatten(), keras.layers.Dense(4)])
    info = checkpoints.ModelInfo(("a", "b", "c", "d"), 28, 32, "standardize")
    checkpoints.save(build_models(network).inference, tmp / "m.keras", info)
    return [*cifar_overrides(world / "cifar"), "mode=evaluate", f"checkpoint={tmp / 'm.keras'}"], (
        "m.keras was trained on classes ['a', 'b', 'c', 'd'] but the dataset has ['airplane', 'automobile',"
    )


def case_checkpoint_of_an_older_version(world, tmp):
    import keras

    keras.Sequential([keras.Input((28, 28, 3)), keras.layers.Flatten(), keras.layers.Dense(10)]).save(tmp / "m.keras")
    return [*cifar_overrides(world / "cifar"), "mode=evaluate", f"checkpoint={tmp / 'm.keras'}"], (
        "m.keras was saved by an older vggtrain (float inputs, no class names inside)"
    )


def case_checkpoint_not_a_model(world, tmp):
    (tmp / "junk.keras").write_bytes(b"PK\x03\x04 not a zip")
    return [*cifar_overrides(world / "cifar"), "mode=evaluate", f"checkpoint={tmp / 'junk.keras'}"], (
        "junk.keras: cannot be loaded as a Keras model"
    )


def case_output_not_writable(world, tmp):
    (tmp / "a_file").write_text("x")
    return [
        *cifar_overrides(world / "cifar"),
        "mode=predict",
        f"checkpoint={world / 'run'}",
        f"predict.input={world / 'cifar'}/test_batch.bin",
        f"predict.output={tmp}/a_file/p.csv",
    ], ("predict.output=")


def _predict(world: Path, checkpoint: Path, output: Path) -> list[str]:
    return [
        *cifar_overrides(world / "cifar"),
        "mode=predict",
        f"checkpoint={checkpoint}",
        f"predict.input={world / 'cifar'}/test_batch.bin",
        f"predict.output={output}",
    ]


def case_predict_onto_a_checkpoint(world, tmp):
    expected = "best.keras: predictions are written as CSV; give a path ending in .csv"
    return _predict(world, world / "run", world / "run" / "checkpoints" / "best.keras"), expected


def case_predict_onto_a_csv_it_did_not_write(world, tmp):
    (tmp / "labels.csv").write_text("name,label\na,1\n")
    return _predict(world, world / "run", tmp / "labels.csv"), "labels.csv exists and is not a prediction CSV"


def case_predict_output_is_a_folder(world, tmp):
    # The checkpoint does not exist: the output is checked first, before anything is loaded or predicted.
    return _predict(world, tmp / "missing.keras", tmp), f"predict.output={tmp} is a folder; give a .csv file path"


CASES = {name[5:]: function for name, function in dict(globals()).items() if name.startswith("case_")}
CASES["label_too_large_tfrecord"] = _bad_label_tfrecord(2)
CASES["negative_label_tfrecord"] = _bad_label_tfrecord(-1)
CASES["short_image_after_record_0"] = _bad_image_tfrecord(bytes(100), "'img_raw' holds 100 bytes, expected 40x40x3")
CASES["empty_image_after_record_0"] = _bad_image_tfrecord(b"", "'img_raw' must hold one non-empty byte string")
CASES["missing_image_after_record_0"] = _bad_image_tfrecord(None, "'img_raw' must hold one non-empty byte string")


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_entry_points_fail_with_one_clear_line(world, tmp_path, name):
    before = _fingerprint(world)
    overrides, expected = CASES[name](world, tmp_path)
    with pytest.raises((UserError, ConfigCompositionException)) as error:
        run_task(compose(overrides, tmp_path / "out"))
    if isinstance(error.value, ConfigCompositionException):  # run.py words Hydra's refusal before Hydra runs
        with pytest.raises(UserError) as error:
            check_composes(overrides, str(CONF))
    message = str(error.value)
    assert expected in message
    assert "\n" not in message, "one line"
    assert _fingerprint(world) == before, "nothing already written is lost"


def test_converter_skips_bad_images_and_rejects_bad_folders(tmp_path):
    folder = tmp_path / "in" / "cat"
    folder.mkdir(parents=True)
    (tmp_path / "in" / "dog").mkdir()
    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(folder / "ok.png")
    Image.fromarray(np.ones((10, 10, 3), np.uint8)).save(tmp_path / "in" / "dog" / "ok.png")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(50))
    (folder / "readme.txt").write_text("not an image")
    manifest = convert(tmp_path / "in", tmp_path / "out", ConvertOptions(image_size=8, workers=1))
    assert {entry["file"] for entry in manifest["skipped"]} == {"cat/broken.jpg", "cat/readme.txt"}
    assert manifest["splits"]["train"]["count"] == 2
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="OUTPUT_DIR .* cannot create it"):
        convert(tmp_path / "in", tmp_path / "file" / "out", ConvertOptions(image_size=8, workers=1))
    with pytest.raises(UserError, match="already holds a converted dataset"):
        convert(tmp_path / "in", tmp_path / "out", ConvertOptions(image_size=8, workers=1))
    assert tfrecords.expand([str(tmp_path / "out" / "train.tfrecords_*")], "x")


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["dataset=cifar", "dataset.data_dir=/nonexistent/cifar"], "error: dataset files data_batch_1.bin"),
        (["mode=evaluate", "checkpoint=/nonexistent/run"], "error: checkpoint=/nonexistent/run: no such file"),
        (["trainer.batch_size=0"], "error: trainer.batch_size must be >= 1; got 0"),
        (["seed=-1"], "error: seed must be in [0, 2**32); got -1"),
        (["dataset.image_size=8"], "error: dataset.image_size must be >= 16 for VGG19's five poolings (0 = the stored"),
        (  # photos have no stored size to fall back on: 0 is refused, so the line does not offer it
            ["dataset=folder", "dataset.data_dir=photos", "dataset.image_size=4"],
            "error: dataset.image_size must be >= 16 for VGG19's five poolings (with the crop, the model would see 4",
        ),
        (  # with steps_per_epoch too: 100000 images a batch exhausted memory after 96 s, and the kernel killed it
            ["trainer.batch_size=100000", "trainer.steps_per_epoch=6"],
            "error: trainer.batch_size=100000 is larger than the 1238 training records",
        ),
        (
            ["strategy=mirrored", "strategy.cpu_devices=2", "trainer.batch_size=15"],
            "error: trainer.batch_size=15 must be divisible by the 2 replicas of the strategy",
        ),
        (  # Hydra's `+` adds the key to the typed section; OmegaConf then dropped it without a word
            ["+optimizer.schedule.warmup=3"],
            "error: optimizer.schedule.warmup is not a key of optimizer.schedule; did you mean "
            "optimizer.schedule.warmup_epochs?",
        ),
        (  # a replica would get an empty last batch: TensorFlow's "bad input data", cut off before its cause
            ["strategy=mirrored", "strategy.cpu_devices=2", "trainer.batch_size=2"],
            "error: trainer.batch_size=2 leaves the last batch of the test split (359 records) 1 record(s) for 2",
        ),
        (["strategy=multi_worker", "strategy.heartbeat_seconds=0"], "error: strategy.heartbeat_seconds must be > 0"),
        (["strategy=multi_worker", "strategy.timeout_seconds=-5"], "error: strategy.timeout_seconds must be > 0"),
        (  # MLflow's file store: a traceback from MLflow at the end of the run
            ["logger=mlflow", "logger.tracking_uri=file:///tmp/mlruns"],
            "error: logger.tracking_uri=file:///tmp/mlruns: MLflow's file store is in maintenance mode",
        ),
        (  # a name the registry refuses: only a warning after the whole run
            ["logger=mlflow", "logger.register_model=''"],
            "error: logger.register_model='': a registered model's name must be non-empty",
        ),
    ],
)
def test_run_py_prints_one_line_without_traceback(tmp_path, monkeypatch, arguments, expected):
    result = run_cli([*arguments, f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(expected)
    assert "Traceback" not in result.stderr
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the debug flag: the error with its full traceback
    with pytest.raises(UserError, match=re.escape(expected.removeprefix("error: "))):
        run_cli([*arguments, f"hydra.run.dir={tmp_path}/d"], cwd=tmp_path)


@pytest.mark.parametrize("argument", ["trainer.epoch=2", "+trainer.epoch=2"])
def test_a_typo_in_a_key_is_our_one_line_with_or_without_plus(tmp_path, argument):
    """Hydra's own message for `trainer.epoch=2` is seven lines, and suggests `+trainer.epoch=2`, which OmegaConf
    then dropped: both are one line naming the nearest key, before anything is composed or written."""
    result = run_cli([argument, f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "r").exists()
    assert result.stderr.strip().splitlines() == [
        "error: trainer.epoch is not a key of trainer; did you mean trainer.epochs?"
    ]


@pytest.mark.parametrize("flags", [["-m", "--cfg", "job"], ["--multirun", "-c", "hydra"], ["--info", "--cfg=job"]])
def test_two_of_hydras_commands_are_one_line_not_its_traceback(tmp_path, flags):
    """`python run.py -m hparams_search=vgg19_asha --cfg job` (to see a search's config) was Hydra's ValueError
    with its traceback: Hydra runs one of --run, --multirun, --cfg, --info, --shell-completion."""
    result = run_cli(["hparams_search=vgg19_asha", *flags, f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "r").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --"), lines
    assert "Hydra takes one of --run, --multirun, --cfg, --info, --shell-completion per command" in lines[0]


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["dataset.imag_size=64"], "dataset.imag_size is not a key of dataset; did you mean dataset.image_size?"),
        (  # against the option chosen: cifar has val_size, a folder has val_fraction
            ["dataset=cifar", "dataset.val_fraction=0.1"],
            "dataset.val_fraction is not a key of dataset; its keys: _target_, augment, cache,",
        ),
        (["model.dropot=0.3"], "model.dropot is not a key of model; did you mean model.dropout?"),
        (["optimizer=sgd", "+optimizer.nesterv=true"], "optimizer.nesterv is not a key of optimizer; did you mean"),
        (["dataset.augment.flp=false"], "dataset.augment.flp is not a key of dataset.augment; did you mean"),
        (
            ["dataset=folder", "dataset.data_dr=x"],
            "dataset.data_dr is not a key of dataset; did you mean dataset.data_dir",
        ),
    ],
)
def test_a_typo_in_a_group_sections_key_is_one_line_naming_the_nearest(tmp_path, arguments, expected):
    """`dataset.`, `model.`, `optimizer.` keys depend on the option chosen: checked against the composed section,
    with `+` or without, before Hydra's seven lines and before anything is written."""
    result = run_cli([*arguments, f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "r").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), lines


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["trainer.epochs=one"], "trainer.epochs must be an integer; got 'one'"),  # Hydra: a 6-line merge error
        (  # bash expands ~ after NAME= only: the docs' `dataset.data_dir=~/...` reached Hydra as it was typed
            ["dataset=tfds", "dataset.data_dir=~/tensorflow_datasets"],
            "dataset.data_dir=~/tensorflow_datasets: the shell leaves ~ as it is after a dotted key, and Hydra cannot "
            "read it; write dataset.data_dir=$HOME/tensorflow_datasets",
        ),
        (["optimizer.lr=interval(0,"], "optimizer.lr=interval(0,: Hydra cannot read this override (no viable alte"),
        (["optimizer=adamm"], "optimizer must be one of adam, adamw, sgd; got 'adamm'"),  # Hydra: 10 lines
        (["+experiment=nope"], "experiment must be one of cats_dogs_finetune, cifar_vgg19,"),
        (["dataset=folder", "dataset.image_size=abc"], "dataset.image_size must be an integer; got 'abc'"),
        (["trainer.deterministic=maybe"], "trainer.deterministic must be true or false; got 'maybe'"),
        (["trainer.precision=float17"], "trainer.precision must be one of auto, float32, mixed_float16, mixed_bf"),
        # the choices of a Choice field, each as Hydra composes it (jit_compile: when the schema is checked)
        (["trainer.jit_compile=maybe"], "trainer.jit_compile must be one of auto, true, false; got 'maybe'"),
        (["trainer.verbose=5"], "trainer.verbose must be one of 0, 1, 2; got '5'"),
        (["evaluate.tta=flop"], "evaluate.tta must be one of none, flip; got 'flop'"),
        (["predict.tta=mirror"], "predict.tta must be one of none, flip; got 'mirror'"),
        (["predict.format=csv"], "predict.format must be one of auto, images, binary, tfrecord, records; got 'csv'"),
        (["dataset=cats_dogs", "dataset.compression=lz4"], "dataset.compression must be one of auto, none, gzip,"),
        (["strategy=multi_worker", "strategy.cluster=k8s"], "strategy.cluster must be one of auto, tf_config, work"),
        (["dataset=cifar", "dataset.channels=2"], "dataset.channels must be one of 1, 3; got '2'"),
        (["sed=3"], "sed is not a top-level key; did you mean seed?"),
    ],
)
def test_a_wrong_value_or_option_is_one_line_naming_the_key_and_the_choices(tmp_path, arguments, expected):
    """Hydra's merge error and its missing-option error (with the search path in the middle) become one line:
    the key, what it got, and the type or the options it takes, before anything is written."""
    result = run_cli([*arguments, f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "r").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), lines


def test_an_open_section_and_a_sweep_over_options_are_left_to_the_config(tmp_path):
    from run import CONFIG_DIR
    from trainer.cli.arguments import check_group_keys

    check_group_keys(["dataset=custom", "dataset._target_=x.Y", "dataset.anything=1"], CONFIG_DIR)  # open schema
    check_group_keys(["-m", "model=vgg19,custom", "model.dropot=0.3"], CONFIG_DIR)  # each job composes its own


def test_tensorflows_function_node_prefix_and_escaped_quotes_leave_the_line(tmp_path, monkeypatch):
    import trainer.tasks
    from trainer.errors import DataError

    node = "{{function_node __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/replica:0/task:0/CPU:0}}"

    def fail(*args, **kwargs):
        raise DataError(f"{node} record 7 of \\'a.tfrecord\\' is damaged\n  (img_raw)")

    monkeypatch.setattr(trainer.tasks, "run_task", fail)
    result = run_cli([f"hydra.run.dir={tmp_path}/r"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: record 7 of 'a.tfrecord' is damaged (img_raw)"


def test_converter_command_line_errors_are_one_line(tmp_path, capsys):
    assert convert_main([str(tmp_path / "missing"), str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: INPUT_DIR {tmp_path / 'missing'}: no such folder"]
    odd = tmp_path / "odd\nerror: forged"
    assert convert_main([str(odd), str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: INPUT_DIR {tmp_path}/odd error: forged: no such folder"
    ]


@pytest.mark.parametrize(
    "arguments, refusal",
    [
        (["--workers", "-3"], "argument --workers: must be an integer >= 0; got -3"),
        (["--jpeg-quality", "500"], "argument --jpeg-quality: must be an integer from 1 to 100; got 500"),
        (["--val-fraction", "abc"], "argument --val-fraction: must be a number in [0, 1); got abc"),
        (["--image-size", "0"], "argument --image-size: must be an integer >= 1; got 0"),
    ],
    ids=["negative_workers", "jpeg_quality", "fraction_not_a_number", "image_size_zero"],
)
def test_converter_arguments_out_of_range_are_refused_by_argparse_before_tensorflow(
    tmp_path, capsys, arguments, refusal
):
    with pytest.raises(SystemExit) as exit:
        convert_main([str(tmp_path), str(tmp_path / "o"), *arguments])
    assert exit.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(refusal)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "classes, refusal",
    [
        ("Cat", "--classes Cat: one class; a classifier needs two"),
        ("../in/Cat,Dog", "--classes ../in/Cat: a class is the name of a subfolder of"),
        ("{inside}/Cat,Dog", "--classes {inside}/Cat: a class is the name of a subfolder of"),
        ("..,Dog", "--classes ..: a class is the name of a subfolder of"),
    ],
    ids=["one_class", "relative_path", "absolute_path", "parent"],
)
def test_converter_classes_that_are_paths_or_one_class_are_one_line(tmp_path, capsys, classes, refusal):
    inside = tmp_path / "in"
    for name in ("Cat", "Dog"):
        (inside / name).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(inside / name / "a.png")
    classes, refusal = classes.format(inside=inside), refusal.format(inside=inside)
    assert convert_main([str(inside), str(tmp_path / "o"), "--classes", classes, "--image-size", "8"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {refusal}"), lines
    assert not (tmp_path / "o").exists()


def test_a_converter_image_size_over_the_pixel_limit_is_one_line_before_any_file_is_read(tmp_path, capsys):
    (tmp_path / "flat").mkdir()
    assert convert_main([str(tmp_path / "flat"), str(tmp_path / "o"), "--image-size", "100000"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --image-size 100000: 100000x100000 is over the 89,478,485-pixel limit of one image (a decompression "
        "bomb's)"
    ]


def test_help_describes_the_modes_the_groups_and_the_keys(tmp_path):
    result = run_cli(["--help"], cwd=tmp_path)
    assert result.returncode == 0
    groups = "dataset: cats_dogs, cifar, custom, digits, folder, parquet, tfds"
    expected = ("Modes (mode=...)", "export     a SavedModel", "most used keys", groups)
    for text in expected:
        assert text in result.stdout, text
    assert not (tmp_path / "outputs").exists(), "--help makes no run folder"


def test_a_command_that_fails_before_it_starts_leaves_no_folder(tmp_path):
    result = run_cli(["trainer.batch_size=0"], cwd=tmp_path)  # Hydra made outputs/DATE/TIME and wrote run.log
    assert result.returncode == 1 and "error: trainer.batch_size must be >= 1" in result.stderr
    assert not list((tmp_path / "outputs").glob("*/*")), "no folder for a run that never started"


@pytest.mark.integration
def test_predict_names_a_bad_image_record_after_record_0_in_its_row(tmp_path):
    from trainer.config.store import to_settings
    from trainer.data import predict_inputs
    from trainer.data.preprocess import Preprocess
    from trainer.data.tfrecord_files import TFRecordLoader

    dataset = to_settings(compose(_pets(tmp_path, []))).dataset
    _bad_image_records(tmp_path / "a.tfrecords", None, b"")  # 8 good records
    _bad_image_records(tmp_path / "b.tfrecords", 7, bytes(100))
    chunks = predict_inputs.tfrecord_chunks(
        [tmp_path / "a.tfrecords", tmp_path / "b.tfrecords"],
        TFRecordLoader(dataset).spec([])[0],
        Preprocess(32),
        2,
        4,
        "resize",
    )
    items = [item for chunk_items, _ in chunks for item in chunk_items]
    assert [item.error for item in items[:15]] == [None] * 15
    reason = "record 7 cannot be decoded: 'img_raw' holds 100 bytes, expected 40x40x3 = 4800 (dataset.stored_size)"
    assert items[15].error == f"{tmp_path / 'b.tfrecords'}: {reason}"


def test_a_key_whose_default_is_missing_is_a_key(tmp_path):
    from run import CONFIG_DIR
    from trainer.cli.arguments import check_group_keys

    check_group_keys(["dataset=folder", "dataset.data_dir=photos"], CONFIG_DIR)  # data_dir: ??? until given


def test_a_command_on_a_folder_run_takes_the_folders_keys_from_the_command_line(tmp_path):
    run = _folder_run(tmp_path)
    result = run_cli(
        ["mode=inspect", f"checkpoint={run}", "dataset.val_fraction=0.3", f"hydra.run.dir={tmp_path / 'i'}"]
    )
    assert result.returncode == 1 and "is not a key" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: dataset.data_dir={tmp_path / 'photos'}")
