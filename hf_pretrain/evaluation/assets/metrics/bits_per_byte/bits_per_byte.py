"""Perplexity and bits per byte of a causal language model on held-out text, as an `evaluate` metric.

    import evaluate
    metric = evaluate.load("eval/metrics/bits_per_byte")      # a local folder: nothing is downloaded
    metric.compute(predictions=[open("held_out.txt").read()], model_id="exports/1b")
    # {"bits_per_byte": 1.02, "perplexity": 18.3, "tokens": 251234, "bytes": 1290547}

Each text is one document: the tokenizer's BOS token (its EOS when it has none, the document
separator models trained by hf-pretrain know) is put in front, so every token of the text is
predicted, each exactly once. Texts longer than the window are scored in overlapping windows that
advance by `stride` tokens, every token after the first window seeing at least `window - stride`
tokens of context. Bits per byte divide the summed negative log-likelihood by ln 2 and by the
text's UTF-8 bytes, so unlike perplexity it compares models with different tokenizers.
"""

import math

import datasets
import evaluate
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

_DESCRIPTION = __doc__
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the texts, one document each.
    model_id (str): a model folder or Hub repo id that AutoModelForCausalLM loads.
    window (int, optional): tokens per forward pass; default the model's max_position_embeddings.
    stride (int, optional): tokens a window advances by, below `window`; default window // 2.
    device (str, optional): default cuda when available, else cpu.
    dtype (str, optional): float32, bfloat16 or float16; default float32.
Returns:
    bits_per_byte, perplexity (per token), tokens (predicted), bytes (UTF-8).
"""


def document_nll(model, ids: torch.Tensor, window: int, stride: int) -> float:
    """Summed negative log-likelihood (nats) of ids[1:] given everything before, window by window."""
    total = 0.0
    scored_until = 1  # ids[0] is the BOS context; the next token to score
    for start in range(0, len(ids) - 1, stride):
        end = min(start + window, len(ids))
        chunk = ids[start:end].unsqueeze(0).to(model.device)
        logits = model(input_ids=chunk).logits[0, :-1].float()
        first = scored_until - start - 1  # the logit row that predicts ids[scored_until]
        total += F.cross_entropy(logits[first:], chunk[0, first + 1 :], reduction="sum").item()
        scored_until = end
        if end == len(ids):
            break
    return total


class BitsPerByte(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string")}),
        )

    def _compute(self, predictions, model_id, window=None, stride=None, device=None, dtype="float32"):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=getattr(torch, dtype)).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_id)
        start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start_id is None:
            raise ValueError(f"{model_id}'s tokenizer has neither a BOS nor an EOS token to start documents with")
        window = window or model.config.max_position_embeddings
        stride = stride or window // 2
        if not 0 < stride < window:
            raise ValueError(f"stride={stride} must be positive and below window={window}: windows must overlap")
        nll, tokens, n_bytes = 0.0, 0, 0
        with torch.no_grad():
            for text in predictions:
                # verbose=False: a text longer than the context is expected here, it is scored in windows
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt", verbose=False).input_ids[0]
                nll += document_nll(model, torch.cat([torch.tensor([start_id]), ids]), window, stride)
                tokens += len(ids)
                n_bytes += len(text.encode("utf-8"))
        return {
            "bits_per_byte": nll / math.log(2) / max(n_bytes, 1),
            "perplexity": math.exp(nll / max(tokens, 1)),
            "tokens": tokens,
            "bytes": n_bytes,
        }
