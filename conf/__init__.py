"""vggtrain's config groups. Installed, this folder is the package `trainer.conf` (pyproject's package-dir), which
Hydra reads as `pkg://trainer.conf`; in a clone, `python run.py` reads it where it is. One copy either way.

    from hydra import compose, initialize_config_module
    with initialize_config_module("trainer.conf", version_base="1.3"):
        cfg = compose("config", overrides=["debug=smoke"])
"""
