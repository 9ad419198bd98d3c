"""The manual builds with `mkdocs build --strict`, and its config reference covers every key of the schemas."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import ROOT
from tools import config_reference as reference
from trainer.config import groups, schema
from trainer.config.store import SCHEMAS
from trainer.data import augmentation

SCHEMA_CLASSES = sorted(
    {
        cls
        for module in (schema, groups, augmentation)
        for cls in vars(module).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__
    },
    key=lambda cls: cls.__name__,
)


@pytest.mark.unit
@pytest.mark.parametrize("cls", SCHEMA_CLASSES, ids=lambda cls: cls.__name__)
def test_every_key_of_every_schema_says_what_it_means(cls):
    """A key's meaning in the reference is the comment on its line: a key without one would show blank."""
    comments = reference.field_comments(cls)
    silent = [item.name for item in dataclasses.fields(cls) if not comments.get(item.name)]
    assert silent == [], f"{cls.__name__}: keys without a comment on their line: {silent}"


@pytest.mark.unit
def test_the_reference_lists_every_key_with_its_default():
    text = reference.markdown()
    for group, options in SCHEMAS.items():
        for cls in options.values():
            for item in dataclasses.fields(cls):
                assert f"`{group}.{item.name}`" in text, f"{group}.{item.name}"
    assert "| `trainer.epochs` | int | `30` |" in text and "| `seed` | int | `42` |" in text
    assert "| `dataset.augment.crop` | Crop | `none` |" in text


@pytest.mark.unit
def test_the_committed_reference_is_what_the_schemas_generate():
    """docs/reference/config.md is read on GitHub and in editors as well as in the built manual."""
    committed = (ROOT / "docs" / "reference" / "config.md").read_text()
    assert committed == reference.page(), "regenerate it: python -m tools.config_reference > docs/reference/config.md"


@pytest.mark.unit
def test_a_default_or_meaning_in_angle_brackets_survives_the_html():
    """The MLflow default reads sqlite:///<launch folder>/outputs/mlflow.db: unescaped, the page showed
    sqlite:////outputs/mlflow.db."""
    text = reference.markdown()
    assert "sqlite:///&lt;launch folder&gt;/outputs/mlflow.db" in text and "<launch folder>" not in text


@pytest.mark.integration
def test_the_manual_builds_strictly(tmp_path, monkeypatch):
    pytest.importorskip("material", reason="the [docs] extra (mkdocs-material) is not installed")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build(config)  # strict: a warning (a broken link, a missing snippet) raises
    page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "dataset.augment.crop" in page


@pytest.mark.integration
def test_the_readmes_run_folder_table_and_summary_show_what_a_run_writes(trained_run):
    """Every top-level file and folder of a debug=smoke run (report/ and data.json included) is in the README's
    table, and its sample summary lists the files to open as a run's summary does."""
    from trainer.tracking.reports import RUN_FILES

    _, run_dir = trained_run
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## The run folder")[1].split("## ")[0]
    written = {path.name for path in run_dir.iterdir()} - {"tensorboard"} | {"tensorboard/"}
    stem = {name: name.split(".")[0] if not name.startswith(".") else name for name in written}  # `x.csv`, `.png`
    missing = [name for name in sorted(written) if f"`{name}" not in table and f"`{stem[name]}." not in table]
    assert not missing, f"the README's run-folder table lacks {missing}"
    assert (run_dir / "report" / "report.html").is_file() and "`report/`" in table
    opened = [name for name in RUN_FILES if (run_dir / name).exists()]
    assert f"  open: {', '.join(opened)}\n" in readme
