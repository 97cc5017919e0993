"""The recipe's `evaluation:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key

DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In a shocking discovery, scientists found that",
]


@dataclass
class EvaluationConfig:
    """What a run measures on the side while it trains: validation loss, greedy samples, lm-eval tasks at
    each checkpoint (`training/step.py` and `publish/side_jobs.py` own it).
    """

    eval_interval: int = key(100, "validation loss and samples every this many steps", math=False, ge=0)
    # Evaluation only reads the model, so none of the three keys below changes the weights.
    eval_tokens: int = key(
        8192,
        "validation tokens per evaluation (whole sequences of seq_len, the first ones of "
        "the split), the same whatever the number of processes",
        math=False,
        ge=1,
    )
    prompts: list[str] = key(
        factory=lambda: list(DEFAULT_PROMPTS), math=False, help="fixed prompts sampled greedily at every evaluation"
    )
    sample_max_new_tokens: int = key(32, "tokens generated per prompt", math=False, ge=1)
    # Named after lm-evaluation-harness, whose tasks they are: `bench` is the speed sweep and `benchmarks/`
    # the project's own timings. Their names before (benchmark_tasks, ...) still read: schema.RENAMED_KEYS.
    lm_eval_tasks: list[str] = key(
        factory=list,
        math=False,
        help="lm-eval tasks scored at every saved checkpoint, in a process of their own, into benchmarks.jsonl "
        "(empty = none)",
    )
    lm_eval_limit: int = key(50, "examples per lm-eval task at each checkpoint", math=False, ge=1)
    lm_eval_data_dir: str | None = key(
        None, "folder of local ARC JSONL for the offline arc_*_local lm-eval tasks", math=False
    )
