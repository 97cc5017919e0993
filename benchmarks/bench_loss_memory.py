"""Benchmark: the memory `chunked_loss: true` frees, read off the compiled graph on the CPU.

What a compiled training step keeps for its backward is the set of tensors AOTAutograd's partition
saves between the forward and backward graphs, partitioned as inductor partitions them (min-cut
rematerialisation). This sums their bytes, less the step's own inputs (weights, the batch), for the
stock loss and the chunked one (hf_pretrain/model/loss.py), at the `1b` recipe's width, heads and 32K
vocabulary with 2 of its 16 decoder layers, bf16 autocast as the recipe ships, traced on fake tensors
(shapes and dtypes only: nothing is computed or allocated), so at the recipe's real micro-batch,
8 x 2048 tokens, and at half of it: the slope is the bytes per token, the rest the bytes whatever the length.
The partition depends on the length (below ~2 x hidden tokens, min-cut keeps the chunked loss's bf16
logits gradient rather than its fp32 weight gradient), so the real length is the one to read. The
decoder layers keep the same in both, so the difference holds for the 16-layer model.

    python benchmarks/bench_loss_memory.py            # ~30 s on a CPU, no GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform

import torch

LENGTHS = (4 * 2048, 8 * 2048)  # tokens per measured micro-batch: half the `1b`'s, and the `1b`'s
ONE_B_MICRO_BATCH_TOKENS = 8 * 2048  # the `1b` recipe's micro-batch


def saved_bytes(chunked: bool, tokens: int, layers: int = 2) -> dict:
    """Bytes the compiled step of `tokens` tokens keeps for its backward, and those of [tokens, vocabulary]."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hf_pretrain.config import load_recipe
    from hf_pretrain.model.llama import build_model, llama_config, tokenizer_size_of, train_in_compute_dtype
    from hf_pretrain.model.loss import use_loss_head

    recipe = load_recipe("1b")
    config = llama_config(dataclasses.replace(recipe.model, num_hidden_layers=layers), tokenizer_size_of(recipe.data))
    seq_len = recipe.data.seq_len
    backward_inputs: list[torch.fx.Node] = []

    def forward_compiler(gm, example_inputs):
        return make_boxed_func(gm.forward)

    def backward_compiler(gm, example_inputs):
        backward_inputs.extend(n for n in gm.graph.nodes if n.op == "placeholder")
        return make_boxed_func(gm.forward)

    backend = aot_autograd(  # as inductor calls it: its decompositions and its partition (the GPU's graph)
        fw_compiler=forward_compiler,
        bw_compiler=backward_compiler,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
    )
    torch._dynamo.reset()
    with FakeTensorMode():  # CPU tensors by their shapes alone: autocast applies, nothing is computed
        model = build_model(config)
        use_loss_head(model, "chunked" if chunked else "stock")
        train_in_compute_dtype(model)
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        ids = torch.randint(0, config.vocab_size, (tokens // seq_len, seq_len + 1))
        targets = ids[:, 1:].contiguous()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(input_ids=ids[:, :-1], labels=targets, shift_labels=targets).loss
        loss.backward()
    saved = [
        n.meta["val"] for n in backward_inputs if not n.name.startswith(("tangents", "primals"))
    ]  # primals: the step's own inputs
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    return {
        "saved_bytes": sum(nbytes(t) for t in saved),
        "logits_bytes": sum(nbytes(t) for t in saved if t.numel() >= tokens * config.vocab_size),
        "vocab_size": config.vocab_size,
    }


def per_token(measure) -> tuple[float, float]:
    """(bytes per token, bytes whatever the length) from the two lengths."""
    short, long = (measure(n) for n in LENGTHS)
    slope = (long - short) / (LENGTHS[1] - LENGTHS[0])
    return slope, short - slope * LENGTHS[0]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    results = {(chunked, n): saved_bytes(chunked, n) for chunked in (False, True) for n in LENGTHS}
    vocab = results[(False, LENGTHS[0])]["vocab_size"]
    stock_token, stock_step = per_token(lambda n: results[(False, n)]["saved_bytes"])
    chunked_token, chunked_step = per_token(lambda n: results[(True, n)]["saved_bytes"])
    freed = stock_token - chunked_token
    stock_micro = results[(False, ONE_B_MICRO_BATCH_TOKENS)]["saved_bytes"]
    chunked_micro = results[(True, ONE_B_MICRO_BATCH_TOKENS)]["saved_bytes"]
    print(
        f"1b width, 2 layers, vocabulary {vocab:,}, bf16 autocast, compiled graph's saved tensors (inductor's partition)"
    )
    for name, token, step in (("stock", stock_token, stock_step), ("chunked", chunked_token, chunked_step)):
        print(f"  {name:8s} {token / 1024:8.1f} KiB per token + {step / 2**20:7.1f} MiB whatever the length")
    print(f"  freed     {freed / 1024:8.1f} KiB per token ({freed / vocab:.2f} bytes x vocabulary)")
    print(f"  ratio     {stock_token / chunked_token:.2f}x the saved bytes per token, 2 layers")
    print(
        f"  one 8 x 2048 micro-batch: {stock_micro / 1e9:.2f} GB kept (stock), {chunked_micro / 1e9:.2f} GB (chunked): "
        f"{(stock_micro - chunked_micro) / 1e9:.2f} GB freed"
    )
    print(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "cpu": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "stock_bytes_per_token": stock_token,
                "chunked_bytes_per_token": chunked_token,
                "freed_bytes_per_token": freed,
                "stock_fixed_bytes": stock_step,
                "chunked_fixed_bytes": chunked_step,
                "stock_micro_batch_bytes": stock_micro,
                "chunked_micro_batch_bytes": chunked_micro,
                "stock_logits_bytes": {n: results[(False, n)]["logits_bytes"] for n in LENGTHS},
                "chunked_logits_bytes": {n: results[(True, n)]["logits_bytes"] for n in LENGTHS},
            }
        )
    )


if __name__ == "__main__":
    main()
