"""The benchmark side job's own process: score one checkpoint on a few lm-eval tasks, append the record to
its run's benchmarks.jsonl, print the record as the last line.

publish/side_jobs.py starts it (`python -m hf_pretrain.evaluation.score_checkpoint CHECKPOINT --tasks ...`)
beside training, on a pinned copy of a saved checkpoint, and reads that last line; it never imports this
room: lm-eval loads its own copy of the model here and gives all of its memory back when it ends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_pretrain.evaluation.score_checkpoint")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks")
    parser.add_argument("--limit", type=int, required=True, help="examples per task")
    parser.add_argument("--data_dir", help="local data for the offline tasks")
    args = parser.parse_args(argv)
    from hf_pretrain.evaluation.harness import evaluate_checkpoint  # lm-eval is the optional `eval` extra

    record = evaluate_checkpoint(args.checkpoint, args.tasks.split(","), args.limit, data_dir=args.data_dir)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
