"""The config: typed schemas, their registration with Hydra, run-folder resolvers, and reuse of a run's config.

    python run.py --cfg job        # the composed config, every key with its value

Only this package and `trainer.tasks` read the Hydra config; every other function
takes plain arguments.
"""

from trainer.config.groups import CustomModelConfig, ModelConfig, VGG19Config, VGG19ImageNetConfig
from trainer.config.schema import Config
from trainer.config.store import SCHEMA_GROUP, SCHEMAS, register, to_settings

__all__ = [
    "SCHEMAS",
    "SCHEMA_GROUP",
    "Config",
    "CustomModelConfig",
    "ModelConfig",
    "VGG19Config",
    "VGG19ImageNetConfig",
    "register",
    "to_settings",
]
