"""`python -m hf_pretrain.check.worker PART CONTEXT.json`: one part of the check in its own process
(deadline.py starts it and kills it at its limit). The context names the recipe file, the results file
and what the part needs; the part prints its lines and appends its figures (figures.py)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from hf_pretrain.check.deadline import finished


def probe_in_child(recipe, folder: Path):
    """bench/search.py's probe: two optimizer steps of `recipe` in a fresh process (a grandchild of the
    check, killed with its part), "oom" when the device ran out of memory."""
    from hf_pretrain.bench.variants import RunResult
    from hf_pretrain.config import save_recipe

    folder.mkdir(parents=True, exist_ok=True)
    save_recipe(recipe, folder / "recipe.yaml")
    context = {"recipe": str(folder / "recipe.yaml"), "result": str(folder / "probe.json"), "steps": 2}
    (folder / "probe_context.json").write_text(json.dumps(context))
    command = [sys.executable, "-m", "hf_pretrain.check.worker", "probe", str(folder / "probe_context.json")]
    with (folder / "log.txt").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if (folder / "probe.json").exists():
        return RunResult(**json.loads((folder / "probe.json").read_text()))
    if code in (-9, 137):
        return RunResult("oom", f"killed (exit {code}), probably out of memory")
    return RunResult("failed", f"exit {code}; see {folder / 'log.txt'}")


def search(recipe, report, folder: Path, machine) -> None:
    from hf_pretrain.bench.search import ProbeError, search_micro_batch

    if not machine.on_gpu:
        report.skip("largest micro-batch", "skipped: no GPU (on a CPU nothing runs out of memory)")
        return
    try:
        found = search_micro_batch(recipe, {}, folder, None, report.say, probe=probe_in_child)
    except ProbeError as exc:
        report.skip("largest micro-batch", f"stopped: {exc}")
        return
    tried = ", ".join(f"{p.micro_batch_size}: {p.verdict}" for p in found.probes)
    if found.largest_fitting is None:
        report.skip("largest micro-batch", f"none fits without gradient checkpointing ({tried})")
        return
    report.figure(
        "largest micro-batch",
        found.largest_fitting,
        "sequences",
        f"largest micro-batch without gradient checkpointing: {found.largest_fitting} (by real out-of-memory "
        f"errors; recipe: {recipe.train.micro_batch_size}; {tried})",
    )


def main(argv: list[str]) -> int:
    part, context = argv[0], json.loads(Path(argv[1]).read_text())
    from hf_pretrain.config import load_recipe

    recipe = load_recipe(context["recipe"], context.get("item") or None)
    from hf_pretrain.economics.resolved_run import complete_profile
    from hf_pretrain.machine.run_profile import this_machine

    # this process is the part's door: the machine is asked here, once; the run profile (`auto` attention resolved
    # to the kernel training runs) is built once, when a part that runs the step or its attention asks for it
    machine = this_machine()
    written, model, seq_len = recipe.step_as_written, recipe.model, recipe.data.seq_len
    profile = functools.cache(lambda: complete_profile(written, machine, model=model, seq_len=seq_len))
    step_sections = recipe.sections("model", "data", "train", "optim", "compute")  # what a step is built from
    if part == "probe":
        from hf_pretrain.check.synthetic_step import probe

        Path(context["result"]).write_text(json.dumps(probe(profile(), context["steps"], **step_sections)))
        return 0
    from hf_pretrain.check.figures import Report

    report = Report(part, Path(context["results"]), machine.gpu_name)
    limit = float(context["limit_s"])
    folder = Path(context["folder"])
    if part == "health":
        from hf_pretrain.check import health

        health.measure(report, limit, machine)
    elif part == "matmul":
        from hf_pretrain.check import matmul

        matmul.measure(report, limit, machine)
    elif part == "attention":
        from hf_pretrain.check import sdpa

        # its micro-batch and precision on this machine
        sdpa.measure(recipe.model, profile().step, report, limit, machine, seq_len=recipe.data.seq_len)
    elif part == "step":
        from hf_pretrain.check import synthetic_step as step

        step.measure(profile(), context.get("item") or {}, report, context["steps"], context["warmup"], **step_sections)
    elif part == "micro_batch":
        search(recipe, report, folder / "micro_batch", machine)
    elif part == "disk":
        from hf_pretrain.check import volume_speed as disk
        from hf_pretrain.economics.memory import CHECKPOINT_BYTES_PER_PARAMETER
        from hf_pretrain.model.llama import model_parameter_count, tokenizer_size_of
        from hf_pretrain.store.location import Where

        if Where.of(recipe).run.in_store:
            report.skip("disk", "skipped: output_dir is an object store (part f measures it)")
        else:
            checkpoint = int(
                CHECKPOINT_BYTES_PER_PARAMETER * model_parameter_count(recipe.model, tokenizer_size_of(recipe.data))
            )
            disk.measure(Path(recipe.train.output_dir), checkpoint, report, limit)
    elif part == "object_store":
        from hf_pretrain.check import store_rates
        from hf_pretrain.store.location import Where

        store_rates.measure(Where.of(recipe), report)  # where the run and its data live: decided here, at the door
    elif part == "all_reduce":
        from hf_pretrain.check import all_reduce

        all_reduce.measure(report, folder, machine)
    else:
        raise SystemExit(f"unknown part {part!r}")
    sys.stdout.flush()
    finished(Path(argv[1])).touch()  # all said: a kill from here on cuts nothing
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
