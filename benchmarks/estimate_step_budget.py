"""Estimate: where the `1b` recipe's optimizer step spends its time on one H100 SXM, by part, for each
configuration a flag picks. A view of the one performance model (hf_pretrain/economics/performance.py),
beside what the H100 of the shared GPU table measured where it measured that configuration.
docs/gpu.md prints the table.

    python benchmarks/estimate_step_budget.py            # the markdown table
"""

from __future__ import annotations

from hf_pretrain.config import load_recipe
from hf_pretrain.economics.performance import physical_limit, step_time
from hf_pretrain.economics.workload import run_workload
from hf_pretrain.machine.gpus import gpu_named
from hf_pretrain.machine.what_if import profile_on

GPU = "H100 SXM"
# (column, recipe flags, what the shared table's H100 measured, 2026-11-25; None: not measured)
CONFIGURATIONS = [
    ("as shipped (compile)", {}, "77,750-78,120"),
    ("`--compile false`", {"compile": False}, "51,150"),
    ("`--compile false --liger true`", {"compile": False, "liger": True}, "72,900"),
    ("`--liger true` (compiled)", {"liger": True}, "crashed under compile"),
    ("`--optimizer muon`", {"optimizer": "muon"}, None),
    ("`--mixed_precision fp8`", {"mixed_precision": "fp8"}, None),
]


def table() -> str:
    gpu = gpu_named(GPU)
    columns = []
    for name, flags, measured in CONFIGURATIONS:
        recipe = load_recipe("1b", flags)
        step = profile_on(recipe.step_as_written, gpu).step  # the recipe's step on that card
        work = run_workload(recipe.model, recipe.data, step, recipe.train.global_batch_tokens)
        columns.append((name, step_time(work, gpu), work, measured, recipe.train.global_batch_tokens))
    lines = [
        "| part (ms per 131,072-token step) | " + " | ".join(c[0] for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for part in columns[0][1].parts():
        lines.append(f"| {part} | " + " | ".join(f"{c[1].parts()[part] * c[4] * 1e3:,.0f}" for c in columns) + " |")
    lines.append("| **total** | " + " | ".join(f"**{c[1].total * c[4] * 1e3:,.0f}**" for c in columns) + " |")
    lines.append("| tokens/s (estimate) | " + " | ".join(f"{c[1].tokens_per_s:,.0f}" for c in columns) + " |")
    lines.append(
        "| tokens/s measured (H100 SXM, 2026-11-25) | " + " | ".join(c[3] or "not measured" for c in columns) + " |"
    )
    lines.append(
        "| MFU of 989 TFLOP/s (estimate) | "
        + " | ".join(f"{c[1].tokens_per_s * c[2].flops_per_token / gpu.bf16_flops:.1%}" for c in columns)
        + " |"
    )
    lines.append(
        "| physical limit, tokens/s | " + " | ".join(f"{physical_limit(c[2], gpu):,.0f}" for c in columns) + " |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
