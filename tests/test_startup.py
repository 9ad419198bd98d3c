"""What `python run.py` does before its first training step (issue 52 part 5): Hydra composes the config once after
the command's own check, not twice (upstream hydra#3440: `get_mode` composes it only to read `hydra.mode`).

    python -m benchmarks --only startup
"""

from __future__ import annotations

import pytest

from conftest import run_cli


@pytest.mark.integration
def test_hydra_composes_the_config_once_after_the_commands_check(monkeypatch, tmp_path):
    from hydra._internal.hydra import Hydra

    import trainer.tasks

    calls, original = [], Hydra.compose_config

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counting)
    monkeypatch.setattr(trainer.tasks, "run_task", lambda cfg, **_: 0.5)  # the task is not the point
    result = run_cli(["debug=smoke", "trainer.epochs=2", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(calls) == 2, f"our check and Hydra's run, not Hydra's get_mode too: {calls}"


@pytest.mark.unit
@pytest.mark.parametrize(
    "arguments, mode",
    [
        (["debug=smoke"], None),  # the config leaves it to the command line: run, or -m
        (["hparams_search=vgg19_optuna"], "MULTIRUN"),  # the preset sets hydra.mode
        (["hydra.mode=MULTIRUN"], "unknown"),  # Hydra's own setting: Hydra reads it
        (["optimizer.lr=0.1,0.01"], "unknown"),  # a sweep of values
    ],
)
def test_the_commands_check_gives_hydra_the_mode_its_compose_found(arguments, mode):
    from trainer.cli.hydra_mode import UNKNOWN
    from trainer.cli.main import CONFIG_DIR
    from trainer.cli.overrides import check_composes

    found = check_composes(arguments, CONFIG_DIR)
    assert ("unknown" if found is UNKNOWN else None if found is None else found.name) == mode
