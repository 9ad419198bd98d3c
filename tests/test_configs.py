"""Every config group composes into valid settings; bad keys, types and values fail at startup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from conftest import CONF, compose
from trainer.config import to_settings
from trainer.data.formats.binary import BinaryFiles
from trainer.errors import ConfigError

pytestmark = pytest.mark.unit

GROUP_OPTIONS = [
    (group, path.stem)
    for group in ("dataset", "model", "optimizer", "strategy", "experiment", "debug", "callbacks", "logger")
    for path in sorted((CONF / group).glob("*.yaml"))
]
REQUIRED = {  # keys without a default
    "model=custom": ["model._target_=trainer.models.vgg19.build_vgg19"],
    "dataset=custom": ["dataset._target_=trainer.data.formats.folder.ImageFolder"],
    "dataset=folder": ["dataset.data_dir=photos"],
    "dataset=parquet": ["dataset.data_dir=x"],
    "dataset=tfds": ["dataset.data_dir=x", "dataset.tfds_name=beans"],
}


@pytest.mark.parametrize("group, option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes_and_validates(group, option):
    settings = to_settings(compose([f"{group}={option}", *REQUIRED.get(f"{group}={option}", [])]))
    assert settings.mode == "train"


def test_default_is_digits_with_the_tuned_model():
    settings = to_settings(compose([]))
    assert isinstance(settings.dataset, BinaryFiles)
    assert settings.dataset.name == "digits"
    assert settings.model.width_multiplier == 0.25  # from conf/dataset_model/digits_vgg19.yaml
    assert settings.model.batch_norm and settings.model.batch_norm_momentum == 0.9
    assert settings.objective.metric == "val_accuracy"


def test_experiment_preset_switches_dataset_and_recipe():
    settings = to_settings(compose(["experiment=cifar_vgg19"]))
    assert settings.dataset.name == "cifar"
    assert settings.model.batch_norm and settings.model.width_multiplier == 1.0
    assert settings.optimizer.lr == 0.1 and settings.optimizer.schedule.name == "step"


def test_cifar_vgg19_bn_is_the_published_recipe():
    settings = to_settings(compose(["experiment=cifar_vgg19_bn"]))
    opt, augment = settings.optimizer, settings.dataset.augment
    assert (opt.lr, opt.lr_batch_size, opt.momentum, opt.schedule.name, opt.schedule.factor) == (
        0.05, 128, 0.9, "step", 0.5
    )  # fmt: skip
    assert list(opt.schedule.boundaries) == list(range(30, 300, 30))
    assert (settings.trainer.epochs, settings.trainer.batch_size) == (300, 128)
    assert settings.model.weight_decay == 2.5e-4  # PyTorch's 5e-4 in Keras's L2 (2 l w)
    assert (augment.crop, augment.padding, augment.flip, augment.brightness) == ("pad", 4, True, 0.0)


def test_cifar_vgg19_modern_adds_the_current_recipe_to_the_same_network():
    base, modern = (to_settings(compose([f"experiment={name}"])) for name in ("cifar_vgg19_bn", "cifar_vgg19_modern"))
    assert modern.model == base.model
    assert modern.optimizer.schedule.name == "cosine" and modern.optimizer.schedule.warmup_epochs == 5.0
    assert modern.optimizer.ema_momentum == 0.9998 and modern.trainer.label_smoothing == 0.1
    assert modern.dataset.augment.policy == "randaugment" and modern.dataset.augment.random_erasing == 0.25
    assert modern.evaluate.tta == "flip"


def test_command_line_beats_the_preset():
    settings = to_settings(compose(["experiment=cifar_vgg19", "optimizer.lr=0.02"]))
    assert settings.optimizer.lr == 0.02


@pytest.mark.parametrize(
    "override, error, key",
    [
        ("model.dropuot=0.1", ConfigCompositionException, "dropuot"),
        ("trainer.epochs=many", ConfigCompositionException, "trainer.epochs"),
        ("model.dropout=1.0", ConfigError, "model.dropout"),
        ("optimizer.lr=-0.1", ConfigError, "optimizer.lr"),
        ("trainer.batch_size=0", ConfigError, "trainer.batch_size"),
        ("trainer.epochs=0", ConfigError, "trainer.epochs"),
        ("dataset.augment.crop=diagonal", ConfigCompositionException, "dataset.augment.crop"),
        ("optimizer.schedule.name=linear", ConfigCompositionException, "optimizer.schedule.name"),
        ("objective.mode=up", ConfigCompositionException, "objective.mode"),
        ("dataset.num_classes=3", ConfigError, "dataset.class_names"),
    ],
)
def test_bad_values_fail_naming_the_key(override, error, key):
    with pytest.raises((error, ConfigKeyError, ValidationError)) as raised:
        to_settings(compose([override]))
    message = str(raised.value) + str(raised.value.__cause__ or "")
    assert key in message


# The bad-input matrix of values people type: each fails at start-up, before TensorFlow, with one line naming the key.
OUT_OF_RANGE = [
    (["dataset.image_size=1"], "dataset.image_size must be >= 16"),
    (["dataset.image_size=8"], "dataset.image_size must be >= 16"),
    (
        ["dataset=cifar", "dataset.image_size=0", "dataset.augment.crop=none", "dataset.height=8", "dataset.width=8"],
        "dataset.image_size must be >= 16",
    ),
    (["dataset=cats_dogs", "dataset.image_size=8"], "dataset.image_size must be >= 16"),
    (["dataset=cifar", "dataset.image_size=16"], "dataset.augment.crop_size must be <= the 16-pixel image"),
    (
        ["dataset=cats_dogs", "dataset.image_size=32", "dataset.augment.crop=random", "dataset.augment.crop_size=40"],
        "dataset.augment.crop_size must be <=",
    ),
    (["seed=-1"], "seed must be in [0, 2**32)"),
    (["predict.workers=-1"], "predict.workers must be >= 0"),
    (["model.width_multiplier=1e-9"], "model.width_multiplier must be > 1/128"),
    (["dataset=cifar", "dataset.val_size=10.5"], "dataset.val_size must be a record count or a fraction"),
    (["dataset=cifar", "dataset.val_size=-0.1"], "dataset.val_size must be"),
    (["model.batch_norm_momentum=1.0"], "model.batch_norm_momentum must be in [0, 1)"),
    (["dataset=cifar", "dataset.train_files=[]"], "dataset.train_files must be a glob or a non-empty list"),
]


@pytest.mark.parametrize("overrides, message", OUT_OF_RANGE, ids=[" ".join(o) for o, _ in OUT_OF_RANGE])
def test_out_of_range_values_fail_at_startup_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as raised:
        to_settings(compose(overrides))
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_width_below_one_channel_per_eight_warns(caplog):
    settings = to_settings(compose(["model.width_multiplier=0.05"]))
    assert settings.model.width_multiplier == 0.05
    assert "model.width_multiplier=0.05 leaves block1 3 channel(s)" in caplog.text
    caplog.clear()
    to_settings(compose(["model.width_multiplier=0.125"]))
    assert "model.width_multiplier" not in caplog.text


@pytest.mark.parametrize(
    "overrides, key, expected",
    [
        (
            ["dataset=cats_dogs", "dataset.train_files=/data/trpetdata.tfrecords_*"],
            "train_files",
            ["/data/trpetdata.tfrecords_*"],
        ),
        (["dataset=cats_dogs", "dataset.test_files=[a_*, b_*]"], "test_files", ["a_*", "b_*"]),
        (["dataset=cifar", "dataset.train_files=all.bin"], "train_files", ["all.bin"]),
        (["dataset=cifar", "dataset.val_size=0.1"], "val_size", 0.1),
        (["dataset=cifar", "dataset.val_size=500"], "val_size", 500),
    ],
)
def test_values_as_people_type_them(overrides, key, expected):
    value = getattr(to_settings(compose(overrides)).dataset, key)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "overrides, shown, hidden",
    [
        ([], {"dataset", "model", "optimizer", "trainer", "objective"}, {"predict", "inspect", "export", "finetune"}),
        (["model=vgg19_imagenet", "dataset=cats_dogs"], {"finetune", "optimizer"}, {"predict", "inspect"}),
        (["mode=predict", "checkpoint=run", "predict.input=x"], {"predict", "dataset"}, {"optimizer", "objective"}),
        (["mode=inspect"], {"inspect", "dataset"}, {"optimizer", "trainer", "predict", "checkpoint", "resume"}),
    ],
)
def test_the_config_tree_shows_the_sections_the_mode_reads(overrides, shown, hidden, capsys):
    from trainer.tasks import print_config_tree

    branches = {line.split()[-1] for line in print_config_tree(compose(overrides)).splitlines() if "── " in line}
    assert shown <= branches and not hidden & branches, branches


def test_cfg_job_resolve_prints_the_config_outside_a_run(tmp_path):
    """`python run.py --cfg job --resolve`: Hydra has no run folder yet; the config still prints, and no folder is
    made for it."""
    from conftest import run_cli

    result = run_cli(["--cfg", "job", "--resolve"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "output_dir: (the run folder, made when a run starts)" in result.stdout
    assert not list(tmp_path.iterdir()), "nothing written"


PHOTOS = {
    "folder": ["dataset.data_dir=photos"],
    "parquet": ["dataset.data_dir=x"],
    "tfds": ["dataset.data_dir=x", "dataset.tfds_name=beans"],
    "cats_dogs": [],
}


@pytest.mark.parametrize("dataset", sorted(PHOTOS))
def test_photo_datasets_train_with_the_demos_recipe(dataset):
    settings = to_settings(compose([f"dataset={dataset}", *PHOTOS[dataset]]))
    schedule, augment = settings.optimizer.schedule, settings.dataset.augment
    assert (schedule.name, schedule.warmup_epochs) == ("cosine", 1.0)  # the demo's: conf/dataset_model/digits_vgg19
    assert (augment.crop, augment.min_area, augment.flip) == ("random_resized", 0.25, True)
    assert settings.dataset.image_size == 224 and settings.model.width_multiplier == 1.0  # full size: a GPU's
    quick = to_settings(compose([f"dataset={dataset}", *PHOTOS[dataset], "experiment=photos_quick"]))
    assert (quick.dataset.image_size, quick.model.width_multiplier) == (96, 0.25)
    assert (quick.trainer.batch_size, quick.trainer.epochs, quick.optimizer.schedule.name) == (32, 8, "cosine")


def test_the_help_and_the_data_page_open_with_a_folder_run_for_a_cpu():
    from conftest import run_cli

    command = "python run.py dataset=folder dataset.data_dir=photos/ dataset.val_fraction=0.2 experiment=photos_quick"
    page = (CONF.parent / "docs" / "data.md").read_text()
    assert command in page.split("## ")[0], "docs/data.md opens with it"
    shown = run_cli(["--help"])
    assert command in shown.stdout.split("Modes (mode=...)")[0]
    assert "for a GPU" in shown.stdout.split("Modes (mode=...)")[0]


def test_what_a_strategy_or_a_schedule_is_comes_from_its_schema_not_its_name(tmp_path):
    """The strategy's SPANS_WORKERS (predict refuses a cluster; the worker_dir resolver gives a non-chief worker a
    scratch folder) and the schedule's function (`target`), where `name == ...` tests stood."""
    from trainer.config.resolvers import worker_dir
    from trainer.tasks.predict import predict

    strategies = ("single", "mirrored", "multi_worker")
    spans = [to_settings(compose([f"strategy={name}"])).strategy.SPANS_WORKERS for name in strategies]
    assert spans == [False, False, True]
    cluster = ["strategy=multi_worker", "strategy.workers=[127.0.0.1:2222,127.0.0.1:2223]"]
    folder = str(tmp_path / "run")
    assert worker_dir(folder, None, _root_=compose([*cluster, "strategy.task_index=0"])) == folder  # the chief's
    scratch = worker_dir(folder, None, _root_=compose([*cluster, "strategy.task_index=1"]))
    shutil.rmtree(scratch)
    assert not scratch.startswith(folder)
    asked = ["mode=predict", "checkpoint=x.keras", "predict.input=x", *cluster, "strategy.task_index=0"]
    with pytest.raises(ConfigError, match="^mode=predict runs on one machine"):
        predict(to_settings(compose(asked)))
    names = ("constant", "step", "cosine")
    schedules = [to_settings(compose([f"optimizer.schedule.name={name}"])).optimizer.schedule for name in names]
    assert [schedule.target for schedule in schedules] == [f"trainer.training.optimizers.{name}" for name in names]
    assert [schedule.steps_the_rate for schedule in schedules] == [False, True, True]
    assert [schedule.warms_up for schedule in schedules] == [False, False, True]


def test_the_configs_dataset_comment_lists_every_dataset():
    line = next(line for line in (CONF / "config.yaml").read_text().splitlines() if "- dataset: digits" in line)
    listed = {name.strip() for name in line.split("#", 1)[1].split("|")}
    assert listed == {path.stem for path in (CONF / "dataset").glob("*.yaml")}


def test_each_dataset_format_is_one_file_holding_its_keys_and_its_part():
    """trainer/data/formats/<name>.py is `dataset=`'s `<name>_schema`: the dataclass of its keys is the part itself
    (no constructor restating them), and a saved run's old `_target_` names the same format."""
    from trainer.config import legacy
    from trainer.config.store import SCHEMAS
    from trainer.data import formats
    from trainer.tasks.data import build_part

    assert sorted(SCHEMAS["dataset"]) == sorted(
        f"{path.stem}_schema"
        for path in Path(formats.__file__).parent.glob("*.py")
        if path.stem not in ("__init__", "base")
    )
    for kind in SCHEMAS["dataset"].values():
        if kind.OPEN is None:
            assert kind._target_ == f"{kind.__module__}.{kind.__qualname__}" and callable(kind.load), kind
    settings = to_settings(compose([]))
    assert build_part(settings.dataset) is settings.dataset, "a built-in format is the checked section itself"
    saved = legacy.upgrade({"dataset": {"_target_": "trainer.data.folder.ImageFolder"}})
    assert saved["dataset"]["_target_"] == "trainer.data.formats.folder.ImageFolder"
