"""`hf-pretrain export`: a standard Hugging Face model folder from a training checkpoint, optionally pushed.

    hf-pretrain export --checkpoint runs/1b --out exports/1b                  # the newest complete checkpoint
    hf-pretrain export --checkpoint runs/1b/checkpoints/step_00050000 --out exports/1b-50k --dtype fp32
    hf-pretrain export --checkpoint runs/1b --out exports/1b --push_to_hub me/tiny-1b [--private] [--revision BRANCH]
    hf-pretrain export --checkpoint runs/1b --out exports/1b --gguf [--gguf_type q8_0]  # plus a GGUF for llama.cpp

The folder holds safetensors weights, `config.json`, `generation_config.json`, a tokenizer that
current and older transformers both load as a plain fast tokenizer, a model card (`README.md`) and
the loss curve it shows. Plain checkpoints and FSDP sharded ones (`pytorch_model_fsdp_0/`) work alike.
"""

from __future__ import annotations

import argparse
import sys

from hf_pretrain.config import CommandParser
from hf_pretrain.publish.formats import DTYPE_NAMES, GGUF_TYPES


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="hf-pretrain export", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a run folder (its newest complete checkpoint) or a checkpoint folder; a URL (s3://...) of either",
    )
    parser.add_argument("--out", required=True, help="folder to write the model to")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16", help="weight precision")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it already holds something")
    parser.add_argument(
        "--push_to_hub", metavar="REPO_ID", help="upload the folder to this model repo (created if missing)"
    )
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", metavar="BRANCH", help="push to this branch (created from main if missing)")
    parser.add_argument("--license", default="apache-2.0", help="license in the model card")
    parser.add_argument("--hardware", help="what the run trained on, for the card, e.g. '1x H100 80GB'")
    parser.add_argument(
        "--price_per_hour",
        type=float,
        ge=0,
        metavar="USD",
        help="what the whole job cost per hour, for the card's cost line (unset: the recipe's "
        "price_per_hour; no cost line when neither is set)",
    )
    parser.add_argument(
        "--gguf",
        action="store_true",
        help="also write the model as a GGUF file for llama.cpp into the folder (`hf-pretrain gguf`)",
    )
    parser.add_argument("--gguf_type", choices=GGUF_TYPES, default="f16", help="tensor type of the GGUF file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print("export: loading torch and the checkpoint...", flush=True)  # seconds, a minute on a loaded machine
    from hf_pretrain.publish import export

    return export.run(args)


if __name__ == "__main__":
    sys.exit(main())
