"""Typed recipe configuration: YAML recipe -> dataclasses -> flat CLI overrides (CLI > YAML > defaults).

`schema` holds the dataclasses (each key with its help and whether it changes the math) and the
checks for contradictions; `parse` reads YAML and the command line. This package is a leaf: it
imports nothing else from hf_pretrain.
"""

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
from .schema import (
    DEFAULT_PROMPTS,
    KEY_SECTION,
    SECTIONS,
    TOP_LEVEL_KEYS,
    DataConfig,
    ModelConfig,
    Recipe,
    RecipeError,
    SourceConfig,
    TrainConfig,
    math_keys,
    tracker_names,
)

__all__ = [
    "DEFAULT_PROMPTS",
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
