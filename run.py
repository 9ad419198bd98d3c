"""vggtrain's entry point in a clone: `python run.py [overrides]` composes conf/ with Hydra and runs one task.

    python run.py                                   # train on the bundled digits
    python run.py dataset=cifar dataset.data_dir=/data/cifar10
    python run.py -m optimizer.lr=0.1,0.01          # a sweep

Installed (`pip install .`), the same command is `vggtrain [overrides]`, from any folder; both are
trainer/cli/main.py and read the same configs. A bad file or config value ends the run with one line
naming it; set HYDRA_FULL_ERROR=1 for the full traceback.
"""

from trainer.cli.main import CONFIG_DIR, cli, main  # noqa: F401  (the tests' `run.cli`, `run.CONFIG_DIR`)

if __name__ == "__main__":
    cli()
