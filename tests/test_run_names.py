"""name= and tags= make the run folder's name readable; the timestamp before them keeps it unique."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from conftest import run_cli
from trainer.config.resolvers import run_label


@pytest.mark.unit
def test_the_label_joins_name_and_tags_with_safe_characters():
    assert run_label(_root_=OmegaConf.create({"name": "my run", "tags": ["a", "b/c"]})) == "_my-run_a-b-c"
    assert run_label(_root_=OmegaConf.create({"name": None, "tags": ["x"]})) == "_x"
    assert run_label(_root_=OmegaConf.create({"name": None, "tags": []})) == ""


@pytest.mark.integration
def test_run_py_puts_name_and_tags_into_the_run_folder(tmp_path):
    # mode=inspect: the quickest command that produces something (a failed one leaves no folder)
    inspect = ["mode=inspect", "inspect.split=val", "inspect.num_images=1"]
    result = run_cli(["name=baseline run", "tags=[cifar,sgd]", *inspect], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (folder,) = (tmp_path / "outputs").glob("*/*")
    assert re.fullmatch(r"\d\d-\d\d-\d\d_baseline-run_cifar-sgd", folder.name), folder.name
