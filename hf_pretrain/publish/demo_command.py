"""`hf-pretrain demo`: a Gradio page that compares checkpoints of a run, or any models, on one prompt.

    hf-pretrain demo --model runs/smoke                  # every checkpoint of the run, and its final model
    hf-pretrain demo --model runs/1b/final --model TinyLlama/TinyLlama_v1.1 --port 7860
    hf-pretrain demo --model s3://bucket/run             # a run in a store: its newest checkpoint, pulled

The page lives in hf_pretrain/publish/space_template/app.py, self-contained so that a Space runs it without
hf-pretrain; this module turns run folders and training checkpoints into the page's model choices.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.extras import missing_extra
from hf_pretrain.store.cache import home

DEFAULT_CACHE_DIR = home() / "demo"  # checkpoints exported for the page, in the user's cache
DEFAULT_TITLE = "Compare checkpoints"  # space_template/app.py's, which imports gradio and torch


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="hf-pretrain demo", description=__doc__)
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="PATH_OR_REPO",
        help="a run folder (all its checkpoints), a checkpoint, a model folder, a Hub repo id or a run URL; "
        "repeat to compare several",
    )
    parser.add_argument(
        "--port", type=int, default=None, ge=1, le=65535, help="port to listen on (unset: GRADIO_SERVER_PORT or 7860)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    parser.add_argument(
        "--cache_dir",
        dest="export_folder",  # the demo's own folder of exported checkpoints, not the store's cache (`store.cache_dir`)
        metavar="FOLDER",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="where checkpoints are exported to model folders",
    )
    parser.add_argument("--title", default=DEFAULT_TITLE, help="the page's title")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # gradio, torch and the models take seconds each (a minute or more on a loaded machine): said first
    print("demo: loading gradio, torch and the models...", flush=True)
    missing = missing_extra("demo")
    if missing:
        print(f"hf-pretrain demo: error: {missing}", file=sys.stderr)
        return EXIT_PREFLIGHT
    from hf_pretrain.store.location import Location

    models = [Location.of(m) for m in args.model]  # local or a store: decided here, once, and handed down
    if any(m.in_store for m in models):  # runs in a store: read through the one door, before torch
        from hf_pretrain.store.reach import StoreRefused
        from hf_pretrain.store.run.reading import readable

        try:
            say = lambda line: print(f"demo: {line}", flush=True)  # noqa: E731
            args.model = [str(readable(m, say=say)) if m.in_store else m.given for m in models]
        except StoreRefused as exc:
            print(f"hf-pretrain demo: error: {exc}", file=sys.stderr)
            return EXIT_PREFLIGHT
    from hf_pretrain.publish import demo

    return demo.run(args)


if __name__ == "__main__":
    sys.exit(main())
