"""`hf-pretrain prepare`: the recipe's corpus -> tokenizer + token shards + meta.json."""

from __future__ import annotations

import sys

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.data import DataMismatchError, prepare
from hf_pretrain.data.sources import SourceError
from hf_pretrain.data.tokenizer import TokenizerError


def main(argv: list[str] | None = None) -> int:
    recipe, _ = parse_recipe_args(
        argv, prog="hf-pretrain prepare", description="Tokenize a recipe's corpus into token shards."
    )
    try:
        data_dir = prepare(recipe)
    except (SourceError, DataMismatchError, TokenizerError) as exc:  # bad input: say what and where, no traceback
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return 1
    print(f"prepared data in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
