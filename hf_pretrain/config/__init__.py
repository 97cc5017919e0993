"""Typed recipe configuration: YAML recipe -> dataclasses -> flat CLI overrides (CLI > YAML > defaults).

Each section of the recipe is a dataclass in a module of its own, `<section>_section.py` (`model`,
`data`, `train`, `optim`, `compute`, `checkpoints`, `store`, `stopping`, `evaluation`, `publish`,
`reporting`); `keys.py` is how a key is declared; `schema` composes the sections into the `Recipe` and
holds the checks of how keys of different sections relate; `parse` reads YAML and the command line.
This package is a leaf: it imports nothing else from hf_pretrain.
"""

from .checkpoints_section import CheckpointConfig
from .compute_section import ComputeConfig
from .data_section import DEFAULT_SOURCE_NAME, DataConfig, SourceConfig
from .evaluation_section import DEFAULT_PROMPTS, EvaluationConfig
from .keys import RecipeError, math_keys
from .model_section import ModelConfig
from .optim_section import OptimConfig
from .parse import (
    RECIPES_DIR,
    CommandParser,
    build_recipe,
    load_recipe,
    parse_recipe_args,
    recipe_dict_from_yaml,
    resolve_recipe_path,
    save_recipe,
)
from .publish_section import PublishConfig
from .reporting_section import ReportingConfig
from .schema import KEY_SECTION, SECTIONS, TOP_LEVEL_KEYS, Recipe, StepAsWritten, tracker_names
from .stopping_section import StoppingConfig
from .store_section import StoreConfig
from .train_section import TrainConfig

__all__ = [
    "DEFAULT_PROMPTS",
    "DEFAULT_SOURCE_NAME",
    "CheckpointConfig",
    "ComputeConfig",
    "EvaluationConfig",
    "OptimConfig",
    "PublishConfig",
    "ReportingConfig",
    "StoppingConfig",
    "StoreConfig",
    "KEY_SECTION",
    "RECIPES_DIR",
    "SECTIONS",
    "TOP_LEVEL_KEYS",
    "CommandParser",
    "DataConfig",
    "ModelConfig",
    "Recipe",
    "RecipeError",
    "SourceConfig",
    "StepAsWritten",
    "TrainConfig",
    "build_recipe",
    "load_recipe",
    "math_keys",
    "parse_recipe_args",
    "recipe_dict_from_yaml",
    "resolve_recipe_path",
    "save_recipe",
    "tracker_names",
]
