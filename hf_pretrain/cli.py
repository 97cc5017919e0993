"""`hf-pretrain` subcommands. Each one is thin and hands over to the module that does the work."""

from __future__ import annotations

import sys

USAGE = """usage: hf-pretrain <command> [--recipe NAME] [--key value ...]

commands:
  prepare   tokenize the recipe's corpus into token shards (trains the tokenizer when asked)
  train     train the recipe in this process (use `accelerate launch hf_pretrain/train.py` for several)

`hf-pretrain <command> --help` lists every recipe key with its default.
"""


def prepare(argv: list[str]) -> int:
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.data import prepare as prepare_data

    recipe, _ = parse_recipe_args(argv, prog="hf-pretrain prepare", description="Tokenize a recipe's corpus into shards.")
    data_dir = prepare_data(recipe)
    print(f"prepared data in {data_dir}")
    return 0


def train(argv: list[str]) -> int:
    from hf_pretrain.train import main

    return main(argv)


COMMANDS = {"prepare": prepare, "train": train}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"hf-pretrain: unknown command `{command}`\n\n{USAGE}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
