"""`hf-pretrain eval`: score a model with lm-evaluation-harness and set it beside reference models.

    hf-pretrain eval --model exports/1b                        # the default zero-shot suite (eval/suites/default.yaml)
    hf-pretrain eval --model exports/1b --tasks arc_easy,hellaswag --limit 200
    hf-pretrain eval --model exports/1b --tasks arc_easy_local,arc_challenge_local --data_dir arc_jsonl/   # ARC as local JSONL
    hf-pretrain eval --model exports/1b --tasks none --text held_out.txt    # perplexity and bits per byte only

`--model` is an exported folder, a Hub repo id, a run folder or a checkpoint, or a run's URL
(`s3://bucket/run`, or one checkpoint of it: its newest complete checkpoint is pulled into the cache
first, store/run/reading.py). Results go to `--output` (default: `<model folder>/eval`, for a URL
`eval_results/<bucket>__<prefix>`): lm-eval's own `results.json` and `results.md`, a
table of this model beside the references in eval/reference_scores.yaml. Pointed at an export,
the scores also go into its model card (`model-index` and the Evaluation section).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.extras import missing_extra


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="hf-pretrain eval", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument(
        "--model",
        required=True,
        help="exported folder, Hub repo id, run folder or checkpoint, or a run URL (s3://bucket/run)",
    )
    parser.add_argument(
        "--tasks",
        default="default",
        help="suite name in eval/suites, a suite YAML, comma-separated lm-eval tasks, or `none`",
    )
    parser.add_argument("--limit", type=float, help="score only the first N documents of each task (a fraction if < 1)")
    parser.add_argument("--num_fewshot", type=int, help="examples in each prompt (unset: the suite's, else lm-eval's)")
    parser.add_argument("--output", type=Path, help="results folder (unset: <model folder>/eval)")
    parser.add_argument("--include_path", action="append", default=[], metavar="DIR", help="extra lm-eval task YAMLs")
    parser.add_argument(
        "--data_dir",
        type=Path,
        help="folder of local data for the offline tasks in eval/tasks (e.g. ARC-Easy-test.jsonl)",
    )
    parser.add_argument("--batch_size", help="lm-eval batch size (unset: auto on a GPU, 8 on the CPU)")
    parser.add_argument(
        "--text", type=Path, metavar="FILE", help="also report perplexity and bits per byte on this text"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    print("eval: loading torch and lm-eval...", flush=True)  # seconds, a minute on a loaded machine
    missing = missing_extra("eval")
    if missing:
        print(f"hf-pretrain eval: error: {missing}", file=sys.stderr)
        return EXIT_PREFLIGHT
    from hf_pretrain.store.location import Location

    model = Location.of(args.model)  # local or a store: decided here, once, and handed down
    if model.in_store:  # a run in a store: read through the one door, before torch is imported
        from hf_pretrain.store.reach import StoreRefused
        from hf_pretrain.store.run.reading import readable

        url = args.model
        try:
            args.model = str(readable(model, say=lambda line: print(f"eval: {line}", flush=True)))
        except StoreRefused as exc:
            print(f"hf-pretrain eval: error: {exc}", file=sys.stderr)
            return EXIT_PREFLIGHT
        args.model_shown = url  # results.md's title: the URL the user gave, not the cache's copy
        if args.output is None:  # not inside the cache's read-only view: beside where the command runs
            args.output = Path("eval_results") / url.split("://", 1)[1].strip("/").replace("/", "__")
    from hf_pretrain.evaluation import harness

    return harness.run(parser, args)


if __name__ == "__main__":
    sys.exit(main())
