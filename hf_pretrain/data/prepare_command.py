"""`hf-pretrain prepare`: the recipe's sources -> tokenizer + a datatrove token folder per source + meta.json."""

from __future__ import annotations

import argparse
import sys

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.data import DataMismatchError, prepare
from hf_pretrain.data.prepare_folder import PrepareLocked
from hf_pretrain.data.sources import SourceError
from hf_pretrain.data.tokenizer import TokenizerError
from hf_pretrain.exit_codes import EXIT_LOCKED


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="print the job script the executor would submit (slurm) instead of running anything",
    )


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(
        argv,
        prog="hf-pretrain prepare",
        description="Tokenize each of a recipe's sources into its own token folder, on datatrove "
        "(--executor local|slurm|ray, --workers N).",
        extra=_flags,
    )
    try:
        data_dir = prepare(recipe, dry_run=args.dry_run)
    except PrepareLocked as exc:  # nothing was touched: the other prepare goes on
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except (SourceError, DataMismatchError, TokenizerError) as exc:  # bad input: say what and where, no traceback
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return 1
    if not args.dry_run:
        print(f"data in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
