"""What a run in the store remembers of itself for the next machine: the URL of its data.

A run trained from data in a store goes on from any machine whose command names only the run's URL:
the data's URL is in the run's resolved recipe in the store (`resolved_recipe.yaml`, mirrored at each
heartbeat), read here in one small request and said in one line. A `--data_dir` on the command line
wins, checked against the run's data identity as always (checkpoints/resume_plan.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from hf_pretrain.store.location import Location, Where

if TYPE_CHECKING:
    from hf_pretrain.config import Recipe

RECORD = "resolved_recipe.yaml"


def names_flag(argv: list[str], key: str) -> bool:
    """Whether the command line sets `key` (`--key V`, `--key=V`, or its kebab-case spelling)."""
    spellings = {f"--{key}", f"--{key.replace('_', '-')}"}
    return any(arg in spellings or arg.split("=", 1)[0] in spellings for arg in argv)


def recorded_data_url(location: str) -> str | None:
    """The data URL the run at `location` (a run URL) was trained from, or None (not a URL, no record,
    a store that cannot be read now: training's own checks say that in their turn)."""
    import yaml

    from hf_pretrain.store.reach import StoreRefused, open_checked

    try:
        url, fs = open_checked(location, write=False)
        record = yaml.safe_load(fs.cat_file(url.join(RECORD).path))
        data = (record.get("data") or {}).get("data_dir")
    except (StoreRefused, FileNotFoundError, OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    # a string read from the store, not handed down by a door: asked here, where it enters (a local path
    # recorded by another machine means nothing on this one)
    return str(data) if data and Location.of(str(data)).in_store else None


def with_remembered_data(
    recipe: Recipe, where: Where, argv: list[str], say: Callable[[str], None] = print
) -> tuple[Recipe, Where]:
    """`recipe` training the data its run URL recorded, when the command line names no `--data_dir`
    and the recipe's own is not a URL (a default such as `data/smoke`, which this machine lacks); and
    `where` (the door's) saying so."""
    if not where.run.in_store or names_flag(argv, "data_dir") or where.data.in_store:
        return recipe, where
    output, data = recipe.train.output_dir, recipe.data.data_dir
    remembered = recorded_data_url(output)
    if remembered is None or remembered == str(data):
        return recipe, where
    say(f"data: {remembered} (the run's own record in {output}; --data_dir overrides it)")
    return recipe.replace(data_dir=remembered), Where(
        where.run, replace(where.data, given=remembered, in_store=True, kind="data")
    )
