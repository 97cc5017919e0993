"""`hf-pretrain prepare`: the recipe's corpus -> tokenizer + token shards + meta.json."""

from __future__ import annotations

import sys

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.data import prepare


def main(argv: list[str] | None = None) -> int:
    recipe, _ = parse_recipe_args(argv, prog="hf-pretrain prepare",
                                  description="Tokenize a recipe's corpus into token shards.")
    data_dir = prepare(recipe)
    print(f"prepared data in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
