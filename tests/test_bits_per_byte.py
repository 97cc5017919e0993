"""Our `evaluate` bits-per-byte metric against lm-eval's own rolling log-likelihood on the same text.

Both put the document separator in front and score every token once. On a text that fits one
context window they must agree to float precision. On a longer text they differ by design: lm-eval
cuts the text into disjoint windows (each new window restarts with one token of context), our metric
slides overlapping windows (every token after the first window sees `window - stride` tokens of
context), so ours is lower, by how much more context buys; docs/evaluation.md records the figure.
"""

from __future__ import annotations

import json
import math

import evaluate
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_pretrain.evaluation import harness

pytestmark = pytest.mark.slow

TEXT = (
    "Pretraining a language model from scratch is mostly plumbing: data, checkpoints and the cost of "
    "every token. Émilie paid 12.50 € for 東京 tea 🙂.\n\tIndented lines, tabs and numbers 3.14159 too.\n"
)

ROLLING_TASK = """
task: local_bits_per_byte
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
"""


def lm_eval_bits_per_byte(folder, texts, tmp_path, max_length=None) -> float:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "local_bits_per_byte.yaml").write_text(ROLLING_TASK.format(data=data))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(folder), batch_size=1, max_length=max_length)
    results = simple_evaluate(
        model=lm, tasks=["local_bits_per_byte"], task_manager=TaskManager(include_path=str(tasks)), log_samples=False
    )
    return results["results"]["local_bits_per_byte"]["bits_per_byte,none"]


def test_our_metric_equals_lm_evals_rolling_loglikelihood_within_one_window(exported, tmp_path):
    metric = evaluate.load(str(harness.BITS_PER_BYTE_METRIC))
    tokens = len(AutoTokenizer.from_pretrained(exported)(TEXT).input_ids)
    assert tokens < 512  # one window for both
    ours = metric.compute(predictions=[TEXT], model_id=str(exported), device="cpu")["bits_per_byte"]
    theirs = lm_eval_bits_per_byte(exported, [TEXT], tmp_path)
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert 0 < ours < 8 * math.log2(4096)  # a byte never costs more than its worst-case token


def test_on_long_text_more_context_only_helps_our_figure(exported, tmp_path):
    text = TEXT * 12  # longer than the 128-token windows below
    metric = evaluate.load(str(harness.BITS_PER_BYTE_METRIC))
    ours = metric.compute(predictions=[text], model_id=str(exported), device="cpu", window=128, stride=64)
    theirs = lm_eval_bits_per_byte(exported, [text], tmp_path, max_length=128)
    assert ours["tokens"] > 128
    assert ours["bits_per_byte"] <= theirs * 1.001  # overlapping windows give every token more context
    assert ours["bits_per_byte"] == pytest.approx(theirs, rel=0.15)  # the same quantity, measured two ways
    print(
        f"bits per byte on {ours['bytes']} bytes: ours {ours['bits_per_byte']:.4f} (window 128, stride 64), "
        f"lm-eval {theirs:.4f} (disjoint windows of 128)"
    )
