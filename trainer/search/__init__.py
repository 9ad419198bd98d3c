"""Hyperparameter search: the vggtrain_optuna Hydra sweeper (`sweeper`), its search space (`space`), its study
and storage (`study`), what it writes (`report`), and a job's side of it (`trial`: pruning, the outcome).

    python run.py -m hparams_search=vgg19_optuna
"""
