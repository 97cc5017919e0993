"""Reading a recipe (YAML, then `--key value` on top) and the one parser every command uses.

Precedence is CLI > YAML > dataclass defaults: as in TRL's TrlParser, the recipe's values become the
defaults of flags that `transformers.HfArgumentParser` builds from the schema, so `--help` shows what a
run of that recipe would use. Anything unknown, mistyped or contradictory raises `RecipeError` (on the
command line: exit status 2) naming the key, before any work starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import sys
import types
import typing
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_USAGE
from hf_pretrain.redaction import redact_values

from .keys import BOUND_CHECKS, RecipeError, did_you_mean, range_text
from .schema import KEY_SECTION, RENAMED_KEYS, SECTIONS, TOP_LEVEL_KEYS, Recipe, legacy_layout, renamed

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------------- typed values
def _string_to_bool(text: str) -> bool:
    from transformers.hf_argparser import string_to_bool  # here: importing transformers costs a second

    return string_to_bool(text)


# How HfArgumentParser reads a flag's text. Text that reaches a number or a boolean another way (a
# `bench --variants` value, YAML 1.1's `3e-4`, which it leaves a string) is read the same way.
FROM_TEXT: dict[Any, Callable[[str], Any]] = {int: int, float: float, bool: _string_to_bool}


def typed(key: str, value: Any, expected: Any) -> Any:
    """`value` checked against the annotation `expected`, or a `RecipeError` naming `key`. Mappings become
    the dataclasses they describe; the only conversions: text read as its flag reads it, a whole number
    where a float is expected, and a float without a fraction where an int is."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):  # `X | None`, the only unions in the schema
        return None if value is None else typed(key, value, args[0])
    if origin is typing.Literal:  # a choice: HfArgumentParser gives its flag the same `choices`
        if value in args:
            return value
        raise RecipeError(f"{key}={value!r} is not one of {', '.join(args)}")
    if dataclasses.is_dataclass(expected) and isinstance(value, dict):
        return _build(expected, value, key)
    if origin is list and isinstance(value, list):
        return [typed(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        return {typed(f"{key} key", k, args[0]): typed(f"{key}.{k}", v, args[1]) for k, v in value.items()}
    if isinstance(value, str) and expected in FROM_TEXT:
        with contextlib.suppress(ValueError, ArgumentTypeError):
            return FROM_TEXT[expected](value)
    elif expected is float and type(value) is int:
        return float(value)
    elif expected is int and type(value) is float and value.is_integer():
        return int(value)
    elif type(value) is expected:
        return value
    kind = "a list" if origin is list else "a mapping" if origin is dict or dataclasses.is_dataclass(expected) else ""
    raise RecipeError(f"{key} must be {kind or expected.__name__}, got {value!r}")


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    types_ = _field_types(cls)
    unknown = [k for k in values if k not in types_]
    if unknown:
        name = unknown[0]
        if name in KEY_SECTION:
            hint = f" (it belongs in the `{KEY_SECTION[name]}:` section)"
        else:  # a section's typo may be any section's key (a recipe of before the sections has them all in `train`)
            hint = did_you_mean(name, KEY_SECTION if cls in SECTIONS.values() else types_)
        raise RecipeError(f"unknown key `{name}` in {where}{hint}")
    return cls(**{k: typed(f"{where}.{k}", v, types_[k]) for k, v in values.items()})


# ---------------------------------------------------------------------- YAML recipes
class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice: plain YAML keeps the last silently."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(
            f"line {line}: `{key}` is given twice (first on line {first_line}); "
            f"keep one, as YAML would otherwise silently use the last"
        )
        self.key, self.line, self.first_line = key, line, first_line


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (a repeated `max_steps:`, or a
    second `train:` section, which would drop the first), naming both lines. Keys a `<<` merge brings
    in may still be overridden: that is what a merge is for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base loader says what is wrong with it
                continue
            if first != key_node.start_mark.line + 1:
                raise DuplicateKeyError(key, key_node.start_mark.line + 1, first)
        return super().construct_mapping(node, deep=deep)


def strict_yaml_load(text: str) -> Any:
    """`yaml.safe_load`, refusing duplicate keys (`DuplicateKeyError`, a `yaml.YAMLError`)."""
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: no arbitrary objects


def resolve_recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist")
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
        raise RecipeError(
            f"no recipe named `{name_or_path}` in {RECIPES_DIR}{did_you_mean(name_or_path, known)}; "
            f"known recipes: {', '.join(known)}"
        )
    return candidate


def recipe_dict_from_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = strict_yaml_load(path.read_text()) or {}
    except DuplicateKeyError as exc:
        raise RecipeError(f"{path}, {exc}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise RecipeError(f"{path} must hold a mapping of sections")
    valid = list(SECTIONS) + TOP_LEVEL_KEYS
    for key, value in raw.items():
        if key not in valid:
            hint = (
                f" (`{key}` belongs in the `{KEY_SECTION[key]}:` section)"
                if key in KEY_SECTION
                else did_you_mean(key, valid)
            )
            raise RecipeError(f"unknown key `{key}` at the top of {path}{hint}")
        if key in SECTIONS and not isinstance(value or {}, dict):
            raise RecipeError(f"section `{key}` in {path} must be a mapping")
    return raw


def _assemble(raw: dict[str, Any], overrides: dict[str, Any] | None, where: str) -> Recipe:
    """Recipe from a YAML mapping plus flat overrides (`{"max_steps": 10}`), typed but not yet validated."""
    raw = legacy_layout(raw)
    sections = {s: dict(raw.get(s) or {}) for s in SECTIONS}
    top = {k: raw[k] for k in TOP_LEVEL_KEYS if k in raw}
    for key, value in renamed(overrides or {}, where).items():
        if key in TOP_LEVEL_KEYS:
            top[key] = value
        elif key in KEY_SECTION:
            sections[KEY_SECTION[key]][key] = value
        else:
            raise RecipeError(f"unknown key `{key}`{did_you_mean(key, list(KEY_SECTION) + TOP_LEVEL_KEYS)}")
    return Recipe(
        **{k: typed(k, v, str) for k, v in top.items()},
        **{s: _build(cls, sections[s], f"{where}:{s}") for s, cls in SECTIONS.items()},
    )


def build_recipe(raw: dict[str, Any], overrides: dict[str, Any] | None = None, where: str = "recipe") -> Recipe:
    """Recipe from a YAML mapping plus flat overrides (`{"max_steps": 10}`), validated."""
    recipe = _assemble(raw, overrides, where)
    recipe.validate()
    return recipe


def load_recipe(name_or_path: str, overrides: dict[str, Any] | None = None) -> Recipe:
    path = resolve_recipe_path(name_or_path)
    return build_recipe(recipe_dict_from_yaml(path), overrides, where=str(path))


def save_recipe(recipe: Recipe, path: str | os.PathLike) -> None:
    """The recipe as YAML in `path` (the run's resolved_recipe.yaml, mirrored to its store), every value
    through the redaction of the lines the product prints: a `--description` holding a credential the
    process holds is written `***`."""
    Path(path).write_text(yaml.safe_dump(redact_values(recipe.to_dict()), sort_keys=False))


# ---------------------------------------------------------------------- the command line
class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and epilogs keep their line breaks; every option shows its default."""


def _is_kebab(flag: str) -> bool:
    return flag.startswith("--") and "-" in flag[2:]


def _number_flag(parser: CommandParser, names: tuple[str, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` of a flag, its `type` wrapped when it is a number: every numeric flag of every command
    (a recipe key's, a command's own) refuses NaN and infinity, and the range a command declares with
    `ge`/`gt`/`le`/`lt` (as `keys.key` does), as it is parsed: one line naming the flag and a value that
    works, exit_codes.EXIT_CONFIG (a value that parses but cannot be used), before any work."""
    bounds = {b: kwargs.pop(b) for b in ("ge", "gt", "le", "lt") if b in kwargs}
    base = kwargs.get("type")
    if base not in (int, float):  # a recipe key's range on a list or a structure: Recipe.validate checks it
        return kwargs
    flag = next((n for n in names if n.startswith("--")), names[0])
    default = kwargs.get("default")
    example = f", e.g. {flag} {default:g}" if isinstance(default, (int, float)) and math.isfinite(default) else ""

    def number(text: str) -> int | float:
        value = base(text)  # a ValueError: argparse says "invalid float value: 'x'" (exit 2: it does not parse)
        in_range = all(BOUND_CHECKS[bound](value, limit) for bound, limit in bounds.items())  # NaN: never
        if not in_range or not math.isfinite(value):  # worded as Recipe.validate words a key's range
            within = f" {range_text(bounds)}" if bounds else ""
            allowed = range_text(bounds) if not in_range else f"a finite number{within}"
            parser.refuse(f"{flag[2:]}={text} must be {allowed}{example}")
        return value

    number.__name__ = base.__name__
    return {**kwargs, "type": number}


def _snake_case(names: tuple[str, ...]) -> list[str]:
    """A flag's names without their kebab-case twins: they are read (`snake_case_flags`), never listed."""
    snake = [n for n in names if not _is_kebab(n)]
    if not snake:
        raise ValueError(f"flags are snake_case, like the recipe keys: {names}")
    return snake


def _same_rules(parser: CommandParser, group: Any) -> Any:
    """`group` (of `parser`) adding its flags by the parser's rules: snake_case, checked numbers."""
    add = group.add_argument
    group.add_argument = lambda *names, **kw: add(*_snake_case(names), **_number_flag(parser, names, kw))
    return group


class CommandParser(argparse.ArgumentParser):
    """The parser of every `hf-pretrain` command, so that they all parse the same way.

    Flags are registered and listed in snake_case, like the recipe keys, and read in both spellings,
    as the Hugging Face tools read them (`--push-to-hub` is `--push_to_hub`); an unknown flag is named
    as it was typed, with the nearest valid one (`--max-stepz`: did you mean `max_steps`?); flags are
    never abbreviated. The recipe's keys come from `recipe_parser`, the same rules on HfArgumentParser;
    a command without a recipe (`stop`, `report`, every `--help`) does not pay for importing transformers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*_snake_case(names), **_number_flag(self, names, kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> argparse._ArgumentGroup:
        """A group (a recipe section in `--help`) whose flags follow the same rule as the parser's own."""
        return _same_rules(self, super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:
        return _same_rules(self, super().add_mutually_exclusive_group(**kwargs))

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # Every parse goes through here (parse_args, HfArgumentParser's dataclass parsing).
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.snake_case_flags(args), namespace)

    def snake_case_flags(self, args: list[str]) -> list[str]:
        """`args` with each `--key-name[=value]` of a known flag spelled `--key_name[=value]`, and a renamed
        recipe key's old name (`--benchmark_tasks`, schema.RENAMED_KEYS) spelled as its new one. Only known
        flags are respelled, so an unknown one is refused as typed; nothing after a bare `--` is touched.
        A key given under both its names is refused, as in a recipe file (schema.renamed): the last would win."""
        spelled = list(args)
        given: dict[str, str] = {}  # a flag as spelled now -> as typed, for a renamed key's two names
        for i, arg in enumerate(spelled):
            if arg == "--":
                break
            name, sep, value = arg.partition("=")
            bare = name[2:].replace("-", "_")
            flag = "--" + RENAMED_KEYS.get(bare, bare)
            if name.startswith("--") and flag != name and flag in self._option_string_actions:
                spelled[i] = flag + sep + value
            if name.startswith("--") and flag[2:] in RENAMED_KEYS.values():
                typed_as = given.setdefault(flag, name)
                if typed_as.replace("-", "_") != name.replace("-", "_"):
                    self.refuse(f"`{typed_as}` and `{name}` are the same key (renamed); keep `{flag}`")
        return spelled

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            bad = [a for a in message.split(":", 1)[1].split() if a.startswith("--")]
            if bad:
                key = bad[0][2:].split("=", 1)[0]
                valid = [a.lstrip("-") for a in self._option_string_actions if a.startswith("--")]
                message = f"unknown key `{key}`{did_you_mean(key, valid)}"
        # one line, not argparse's usage block above it: `--help` has that
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")

    def refuse(self, message: str) -> typing.NoReturn:
        """The flags parse but their values cannot be used: one line, exit_codes.EXIT_CONFIG, nothing done."""
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message}\n")


@functools.cache
def _recipe_parser_class() -> type[CommandParser]:
    from transformers import HfArgumentParser  # a second of imports, paid by the commands that read a recipe

    class RecipeParser(CommandParser, HfArgumentParser):
        """CommandParser's rules on HfArgumentParser, which builds flags from dataclass fields (help from
        their metadata, `--flag` or `--flag false` for booleans, several values for lists)."""

    return RecipeParser


def recipe_parser(dataclass_types: list[type], **kwargs: Any) -> CommandParser:
    """A CommandParser with a flag for every field of `dataclass_types`."""
    return _recipe_parser_class()(dataclass_types, **kwargs)


def _is_structure(annotation: Any) -> bool:
    """A key whose value is a mapping or a list of mappings (`phases`, `sources`): YAML/JSON text on the command line."""
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) is dict or (
        typing.get_origin(annotation) is list and dataclasses.is_dataclass(args[0])
    )


STRUCTURED_KEYS = {k for cls in SECTIONS.values() for k, t in _field_types(cls).items() if _is_structure(t)}


def _flags_of(cls: type) -> type:
    """`cls` as HfArgumentParser should see it: it hands a field's whole metadata to argparse, so this view
    keeps only the help and the range; structured keys take text; the defaults come from the recipe (`set_defaults`)."""
    types_ = _field_types(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in SECTIONS:  # Recipe's sections: their keys come from their own classes
            continue
        annotation = str if _is_structure(types_[f.name]) else types_[f.name]
        bounds = f.metadata.get("range") or {}  # the valid range, as Recipe.validate checks it
        valid = f"; valid {range_text(bounds).removeprefix('in ')}" if bounds else ""
        help_ = (f.metadata["help"] + valid).replace("%", "%%")  # argparse formats help with %-placeholders
        # the range goes to the flag too (CommandParser checks it as the value is parsed, NaN and infinity too)
        fields.append((f.name, annotation, dataclasses.field(default=None, metadata={"help": help_, **bounds})))
    flags = dataclasses.make_dataclass(f"{cls.__name__}Flags", fields)
    section = next((name for name, owner in SECTIONS.items() if owner is cls), None)
    if section:  # `--help` lists each section's keys under its name, as a recipe file holds them
        what = re.split(r"[:(.]", cls.__doc__ or section)[0].strip()
        flags._argument_group_name = f"{section} ({what[:1].lower()}{what[1:]})"
    return flags


def _flag_defaults(recipe: Recipe) -> dict[str, Any]:
    values: dict[str, Any] = {k: getattr(recipe, k) for k in TOP_LEVEL_KEYS}
    for section in SECTIONS:
        for k, v in dataclasses.asdict(getattr(recipe, section)).items():
            values[k] = json.dumps(v) if k in STRUCTURED_KEYS else v
    return values


def _from_flag(key: str, value: Any) -> Any:
    """A flag's value as the recipe key takes it: YAML/JSON text for structures (`--phases '{a: 10}'`);
    a list also as one YAML list (`--prompts '["a", "b"]'`, the spelling before lists took several values)."""
    if key in STRUCTURED_KEYS and isinstance(value, str):
        return _yaml_value(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and value[0].startswith("["):
        return _yaml_value(value[0])
    return value


def _yaml_value(text: str) -> Any:
    try:
        return strict_yaml_load(text)
    except DuplicateKeyError as exc:
        raise RecipeError(f"command-line value {text!r}: {exc}") from None
    except yaml.YAMLError:
        return text  # `typed` names the key


def parse_recipe_args(
    argv: list[str] | None,
    prog: str,
    description: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Recipe, argparse.Namespace]:
    """The recipe named by `--recipe`, every key overridable as `--key value`, validated; `extra` adds the
    command's own flags (they come back in the namespace)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    recipe_flag = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    recipe_flag.add_argument("--recipe", default="smoke", help="recipe name in recipes/ or a path to a YAML file")
    chosen, _ = recipe_flag.parse_known_args(argv)
    parser = recipe_parser(
        [_flags_of(cls) for cls in (Recipe, *SECTIONS.values())],
        prog=prog,
        usage="%(prog)s [--recipe NAME] [--key VALUE ...]",
        description=description,
        parents=[recipe_flag],
    )
    if extra:  # the command's own options, listed by `--help` before the recipe's sections
        recipe_groups = parser._action_groups[2:]  # after argparse's positionals and options
        extra(parser)
        own = [group for group in parser._action_groups[2:] if group not in recipe_groups]
        parser._action_groups[2:] = own + recipe_groups
    try:
        path = resolve_recipe_path(chosen.recipe)
        parser.set_defaults(**_flag_defaults(_assemble(recipe_dict_from_yaml(path), None, where=str(path))))
        args = parser.parse_args(argv)
        flat = {k: _from_flag(k, getattr(args, k)) for k in TOP_LEVEL_KEYS + list(KEY_SECTION)}
        recipe = build_recipe({}, flat, where="command line")
    except RecipeError as exc:
        parser.refuse(str(exc))
    return recipe, args
