"""A recipe as the command line that builds it again: `hf-pretrain prepare --recipe 1b --data_dir /x`.

A fix the product prints must work when pasted: a `prepare` for the data a run needs has to carry
what the run's command line changed (`--data_dir`, `--sources`, `--vocab_size` ...), not only the
recipe's name. So the command names the recipe file the run was built from (the `--recipe` this
process was started with, else the shipped recipe of that name, else the parser's default) and sets
every key the command needs that differs from that file.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Iterable
from typing import Any

from .parse import build_recipe, recipe_dict_from_yaml, resolve_recipe_path
from .schema import KEY_SECTION, TOP_LEVEL_KEYS, Recipe, RecipeError

DEFAULT_RECIPE = "smoke"  # what `--recipe` is when a command is given none


def _set_fields(item: Any) -> Any:
    """A dataclass (a source) as the mapping a recipe writes: only the fields that differ from their defaults."""
    if not dataclasses.is_dataclass(item):
        return item
    default = type(item)()  # type: ignore[operator]
    return {
        f.name: getattr(item, f.name)
        for f in dataclasses.fields(item)
        if getattr(item, f.name) != getattr(default, f.name)
    }


def _flag_text(value: Any) -> str:
    """A value as its flag takes it: structures and lists as one JSON text, booleans as true/false."""
    if isinstance(value, list):
        return json.dumps([_set_fields(v) for v in value])
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _started_with() -> str | None:
    """The `--recipe` value of this process's command line, if any."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--recipe" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--recipe="):
            return arg.split("=", 1)[1]
    return None


def recipe_source(name: str) -> tuple[str, dict[str, Any]]:
    """(what `--recipe` names, the file's mapping) of the recipe file a recipe called `name` was most likely
    built from: this process's `--recipe` if its file has that name, else the shipped recipe of that name,
    else the default recipe (every key that differs is set anyway, so the command is right with any)."""
    for candidate in (_started_with(), name, DEFAULT_RECIPE):
        if not candidate:
            continue
        try:
            raw = recipe_dict_from_yaml(resolve_recipe_path(candidate))
        except RecipeError:
            continue
        if raw.get("name", "custom") == name or candidate == DEFAULT_RECIPE:
            return candidate, raw
    return DEFAULT_RECIPE, {}


def recipe_command(recipe: Recipe, command: str, keys: Iterable[str]) -> str:
    """`hf-pretrain COMMAND --recipe R --key value ...`, which builds a recipe equal to `recipe` in
    `keys` (and in every other key too, where leaving one out would make the recipe invalid)."""
    name, raw = recipe_source(recipe.name)
    base = build_recipe(raw, where=name) if raw else Recipe()
    differing = [k for k in (*TOP_LEVEL_KEYS, *KEY_SECTION) if recipe.value(k) != base.value(k)]
    wanted = [k for k in differing if k in set(keys)]
    try:
        build_recipe(raw, {k: recipe.value(k) for k in wanted})
    except RecipeError:  # e.g. a new seq_len the file's global_batch_tokens does not divide: all of them
        wanted = differing
    words = ["hf-pretrain", command, "--recipe", name]
    for key in wanted:
        words += [f"--{key}", _flag_text(recipe.value(key))]
    return shlex.join(words)
