"""Add what a check measured on a GPU to the project's shipped records and to docs/gpu.md, in one command:

    python benchmarks/ship_check.py runs/gpu_check          # after `make gpu_check`

Reads the check's `check.json` (hf_pretrain/check/command.py): each step figure becomes a line of
hf_pretrain/economics/measured.jsonl (the configuration it ran, tokens/s, peak memory; `plan` and the
doctor read it before the performance model), every figure a check record there too (`attention_backend:
auto` and the slow-node verdict read those), and the whole screen's figures become the section of
docs/gpu.md between its `check` markers, dated and labelled with the card. A CPU's check is refused:
the shipped records are GPU figures.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- check:begin -->", "<!-- check:end -->"


def section(result: dict, device: str, versions: str) -> str:
    lines = [
        BEGIN,
        f"`make gpu_check` on {device}, {result['date']} ({versions}), {result['seconds']:.0f} s:",
        "",
        "| part | what | figure |",
        "|---|---|---|",
    ]
    for f in result["figures"]:
        figure = f"{f['value']:,.2f} {f['unit']}" if f["value"] is not None else f["text"].split(": ", 1)[-1]
        lines.append(f"| {f['part']} | {f['name']} | {figure} |")
    lines += ["", "Verdict: " + "; ".join(result["verdict"]), END]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from hf_pretrain.check.command import check_records
    from hf_pretrain.check.figures import Figure
    from hf_pretrain.config import build_recipe, load_recipe
    from hf_pretrain.economics.measurements import SHIPPED_STORE, configuration, record_measurement
    from hf_pretrain.machine.what_if import measured_card, profile_on

    folder = Path(argv[0] if argv else "runs/gpu_check")
    result = json.loads((folder / "check.json").read_text())
    figures = [Figure(**f) for f in result["figures"]]
    device = next((f.device for f in figures if f.device), None)
    if device is None:
        print(f"ship_check: {folder} was measured on a CPU: the shipped records hold GPU figures only", file=sys.stderr)
        return 2
    recipe = load_recipe(str(folder / "recipe.yaml"))
    source = f"project's check, {result['date']}, docs/gpu.md"
    shipped = 0
    for f in figures:
        if f.part == "step" and f.value:
            configured = build_recipe(recipe.to_dict(), f.detail.get("overrides") or {})
            step = profile_on(configured.step_as_written, measured_card(device)).step  # on the card the check measured
            batch = configured.train.global_batch_tokens
            shipped += bool(
                record_measurement(
                    configuration(configured.model, configured.data, step, global_batch_tokens=batch),
                    device,
                    f.value,
                    f.detail.get("peak_memory_gib"),
                    source,
                    path=SHIPPED_STORE,
                )
            )
    records = check_records(figures)
    with SHIPPED_STORE.open("a") as file:
        file.writelines(json.dumps(asdict(replace(r, date=result["date"]))) + "\n" for r in records)
    versions = f"torch {records[0].torch}, transformers {records[0].transformers}" if records else ""
    page = ROOT / "docs" / "gpu.md"
    text = page.read_text()
    new = section(result, device, versions)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + new + text[text.index(END) + len(END) :]
    else:
        text += "\n" + new + "\n"
    page.write_text(text)
    print(
        f"shipped {shipped} step measurement(s) and {len(records)} check record(s) to {SHIPPED_STORE}; {page} updated"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
