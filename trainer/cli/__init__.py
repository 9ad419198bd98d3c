"""The command line, checked before Hydra starts: each check that Hydra could not make one line of.

    python run.py trainer.epoch=2                   # one line naming trainer.epochs (arguments.py)
    python run.py trainer.epochs=one                # one line: the key, what it got, the type (overrides.py)
    python run.py -m hparams_search=vgg19_optuna    # without the [sweep] extra: one line naming it (hints.py)

`run.py`'s `cli` calls them on the raw arguments; they may read the config's schemas, and nothing here
runs a task.
"""
