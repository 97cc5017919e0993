"""A recipe key: its default, help, range and whether it changes the math; the checks every section shares.

Every section of the recipe (`model_section.py`, `optim_section.py`, ...) declares its keys with
`key(...)`; `check_ranges` and `math_keys` read that metadata, whatever the section.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
from collections.abc import Iterable
from typing import Any


class RecipeError(ValueError):
    """A recipe or override that cannot describe a valid run."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """` (did you mean `x`?)` for a mistyped name: its snake_case spelling if that is valid (`--max-steps`),
    else the closest spelling and the keys with `name` as one of their words (`price` -> `price_per_hour`),
    three at most; empty when none is near."""
    valid, wanted = list(valid), name.replace("-", "_")
    close = [wanted] if wanted in valid else difflib.get_close_matches(wanted, valid, n=1, cutoff=0.6)
    near = [f"`{n}`" for n in dict.fromkeys(close + [v for v in valid if wanted in v.split("_")])][:3]
    listed = " or ".join([", ".join(near[:-1]), near[-1]] if len(near) > 1 else near)
    return f" (did you mean {listed}?)" if near else ""


def key(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    math: bool = True,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A recipe key: its default, its `--help` text, whether changing it changes the trained weights
    (`math=False`: where files go, how often we log or save, what we publish or measure on the side),
    and, for a number, its valid range (`ge`/`gt`: at least/above, `le`/`lt`: at most/below), which
    `Recipe.validate` checks before any work, naming the key."""
    bounds = {name: value for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if value is not None}
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"help": help, "math": math, "range": bounds}
    )


def range_text(bounds: dict[str, float]) -> str:
    """`[0, 1)`, `> 0`, `>= 1`: a key's valid range as people write it."""
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = (bounds["le"], "]") if "le" in bounds else (bounds["lt"], ")") if "lt" in bounds else None
    if low and high:
        return f"in {low[0]}{_number(low[1])}, {_number(high[0])}{high[1]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f"{'<=' if high[1] == ']' else '<'} {_number(high[0])}"
    return "any number"


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else f"{value:g}"


BOUND_CHECKS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def check_ranges(config: Any, where: str = "") -> None:
    """Every numeric key of `config` (a section, a source, the whole recipe, nested) inside the range its
    metadata declares; a NaN is outside every range. Raises naming the first key that is not."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, where)
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_ranges(item, f"{where}{f.name}[{i}].")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and f.metadata.get("range"):
            if not all(BOUND_CHECKS[bound](value, limit) for bound, limit in f.metadata["range"].items()):
                allowed = range_text(f.metadata["range"])
                raise RecipeError(f"{where}{f.name}={value} must be {allowed}: {f.metadata['help']}")


def math_keys(config: Any) -> dict[str, Any]:
    """The keys of `config` (a section, a source or the whole recipe) that change the math, nested as in YAML."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = math_keys(value)
        elif f.metadata["math"]:
            is_list = isinstance(value, list)  # of sources: each source's own math keys
            out[f.name] = [math_keys(v) if dataclasses.is_dataclass(v) else v for v in value] if is_list else value
    return out
