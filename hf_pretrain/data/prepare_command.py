"""`hf-pretrain prepare`: the recipe's sources -> tokenizer + a datatrove token folder per source + meta.json."""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
from pathlib import Path

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.data.prepare_folder import PrepareLocked
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError
from hf_pretrain.data.sources import SourceError
from hf_pretrain.data.tokenizer import TokenizerError
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_LOCKED, EXIT_WRITE_FAILED
from hf_pretrain.formatting import human_bytes
from hf_pretrain.store.data.data_upload import UploadIncomplete
from hf_pretrain.store.location import Where
from hf_pretrain.store.store_calls import StoreError
from hf_pretrain.store.urls import StoreUnavailable


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="print the job script the executor would submit (slurm) instead of running anything",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show datatrove's own log on the screen too (it always goes to data_dir/logs/<source>/)",
    )


def free_space(folder: Path) -> str:
    """`12.0 GB free on /data`: the free space of the disk that holds `folder` (or its nearest parent)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return f"{human_bytes(shutil.disk_usage(folder).free)} free on {folder}"


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(
        argv,
        prog="hf-pretrain prepare",
        description="Tokenize each of a recipe's sources into its own token folder, on datatrove "
        "(--executor local|slurm|ray, --workers N).",
        extra=_flags,
    )
    data = Where.of(recipe).data  # where the data lives: decided here, once, and handed down
    try:
        data_dir = prepare(recipe, dry_run=args.dry_run, verbose=args.verbose, data=data)
    except PrepareLocked as exc:  # nothing was touched: the other prepare goes on
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except StoreError as exc:  # the store: unreachable, refused (before any work) or an upload cut short
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED if isinstance(exc, UploadIncomplete) else EXIT_CONFIG
    except StoreUnavailable as exc:
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (SourceError, DataMismatchError, TokenizerError) as exc:  # bad input: say what and where, no traceback
        print(f"hf-pretrain prepare: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        where = Path(recipe.data.data_dir)
        print(
            f"hf-pretrain prepare: the disk is full ({free_space(where)}) writing {exc.filename or where}: free "
            f"space there, then run the same command again: it goes on with the tasks not yet done",
            file=sys.stderr,
        )
        return EXIT_WRITE_FAILED
    if not args.dry_run:
        print(f"data in {data if data.in_store else data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
