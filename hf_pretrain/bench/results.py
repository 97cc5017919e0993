"""The bench's verdict (does the recipe leave speed on the table, and what to change) and bench.md."""

from __future__ import annotations

from typing import Any

from hf_pretrain.bench.search import SearchResult
from hf_pretrain.bench.variants import VariantResult, recipe_value
from hf_pretrain.formatting import formatted, human_count
from hf_pretrain.machine.run_profile import Step

# A variant must beat the recipe by more than this to count as speed left on the table: short
# runs on a busy machine wobble by a few percent.
SPEEDUP_THRESHOLD = 0.03


def advice(variants: list[VariantResult], search: SearchResult | None, written: Step) -> tuple[bool, list[str]]:
    """(does the recipe leave speed on the table, what to change); `written`: the recipe's step as written
    (its micro-batch and checkpointed layers)."""
    base = variants[0]
    notes: list[str] = []
    if base.tokens_per_s is None:
        first_line = base.message.splitlines()[0] if base.message else ""
        return False, [f"the recipe as written did not run ({base.status}): {first_line}"]
    left_on_table = False
    mb, checkpointing = written.micro_batch_size, written.checkpointed_layers > 0
    if search and search.largest_fitting:
        if checkpointing and search.largest_fitting >= mb:
            left_on_table = True
            notes.append(
                f"gradient checkpointing is on, but micro_batch_size {mb} fits without it: "
                f"--gradient_checkpointing false --checkpointed_layers 0 saves the recomputation"
            )
        elif search.largest_fitting > mb:
            notes.append(
                f"micro_batch_size {search.largest_fitting} fits without gradient checkpointing (the recipe uses {mb})"
            )
    measured = [v for v in variants if v.tokens_per_s is not None]
    fastest = max(measured, key=lambda v: v.tokens_per_s or 0.0)
    gain = fastest.tokens_per_s / base.tokens_per_s - 1
    if fastest is not base and gain > SPEEDUP_THRESHOLD:
        left_on_table = True
        flags = " ".join(f"--{k} {recipe_value(v)}" for k, v in fastest.overrides.items())
        notes.append(f"fastest measured: {fastest.name}, {gain:+.1%} tokens/s over the recipe: {flags}")
    else:
        notes.append(f"no measured variant beats the recipe by more than {SPEEDUP_THRESHOLD:.0%}")
    return left_on_table, notes


def dollar_table(result: dict[str, Any]) -> list[str]:
    """$ per billion tokens: measured on this GPU's price entry; the table's other GPUs as estimates (the
    performance model scaled by this card's measured / modelled). Nothing on a CPU."""
    priced = [v for v in result["variants"] if v["usd_per_billion_tokens"] or v["usd_per_billion_tokens_estimated"]]
    if not priced:
        return [
            "",
            "$ per billion tokens: none. This ran on "
            + (
                "a CPU, whose speed says nothing of a GPU's; `hf-pretrain plan --gpu all` models each GPU"
                if result["peak_flops"]["on_cpu"]
                else "a GPU without a price entry or a performance model (machine/gpus.yaml)"
            ),
        ]
    this = result["price_entry_of_device"]
    lines = [
        "",
        "$ per billion tokens: measured for this GPU only; every other row is an estimate, the performance "
        "model's tokens/s for that GPU (economics/performance.py) scaled by what this card measured against "
        "its own model (fit in memory not checked: `hf-pretrain plan --gpu all` fits each GPU)",
        "",
        "| GPU | figure | $/hour | " + " | ".join(v["name"] for v in priced) + " |",
        "|---|---|---|" + "---|" * len(priced),
    ]
    ratios = " / ".join(formatted(v["measured_to_modelled"], ".2f") for v in priced)
    for name, price in result["prices"].items():
        if name == this and all(name in v["usd_per_billion_tokens"] for v in priced):
            figure, cells = "measured (this GPU)", [v["usd_per_billion_tokens"][name] for v in priced]
        elif all(name in v["usd_per_billion_tokens_estimated"] for v in priced):
            figure, cells = (
                f"estimate (model x {ratios})",
                [v["usd_per_billion_tokens_estimated"][name] for v in priced],
            )
        else:
            continue  # a price entry the GPU table does not know: no model to scale
        lines.append(f"| {name} | {figure} | {price:,.2f} | " + " | ".join(f"{c:,.2f}" for c in cells) + " |")
    return lines


def markdown_report(result: dict[str, Any]) -> str:
    """bench.md from the bench.json dictionary."""
    peak = result["peak_flops"]
    lines = [
        f"# hf-pretrain bench: {result['recipe']}",
        "",
        f"{result['device']} | torch {result['torch']} | {result['date']}",
        f"model: {human_count(result['parameters'])} parameters, {result['flops_per_token'] / 1e6:,.1f} MFLOP per "
        f"token | {result['steps']} steps per variant, the first {result['warmup']} excluded from timing",
        f"peak TFLOP/s: datasheet {formatted(peak['datasheet'] and peak['datasheet'] / 1e12, ',.0f')}; measured "
        f'{peak["measured"] / 1e12:,.3f} ({peak["measured_with"]}); "MFU of measured peak" divides by it',
        "",
        "| variant | status | tokens/s | vs recipe | s/step | MFU | MFU of measured peak | peak memory (GiB) | data wait |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in result["variants"]:
        lines.append(
            f"| {v['name']} | {v['status']} | {formatted(v['tokens_per_s'], ',.0f')} | "
            f"{formatted(v['speedup_vs_recipe'], '+.1%')} | {formatted(v['step_seconds'], '.3f')} | "
            f"{formatted(v['mfu'], '.1%')} | {formatted(v['mfu_measured_peak'], '.1%')} | "
            f"{formatted(v['peak_memory_gib'], '.2f')} | {formatted(v['data_wait_share'], '.1%')} |"
        )
    lines += dollar_table(result)
    search = result["micro_batch_search"]
    if search:
        budget = f", budget {search['memory_budget_gib']:.2f} GiB" if search["memory_budget_gib"] else ""
        lines += [
            "",
            f"Largest micro-batch without gradient checkpointing{budget}: "
            f"**{search['largest_fitting'] or 'none fits'}** (candidates {search['candidates']})",
            "",
            "Each micro-batch was tried on the device: running out of memory is the answer, the memory "
            "estimate decides nothing.",
            "",
            "| micro_batch_size | fits | status | peak memory (GiB) | verdict |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {p['micro_batch_size']} | {'yes' if p['fits'] else 'no'} | {p['status']} | "
            f"{formatted(p['peak_memory_gib'], '.2f')} | {p['verdict']} |"
            for p in search["probes"]
        ]
    if result["micro_batch_search_error"]:
        lines += ["", f"The micro-batch search stopped: {result['micro_batch_search_error']}"]
    verdict = (
        "leaves speed on the table" if result["leaves_speed_on_the_table"] else "leaves no measured speed on the table"
    )
    lines += ["", f"The recipe as written {verdict}:", ""] + [f"- {note}" for note in result["advice"]]
    return "\n".join(lines) + "\n"
