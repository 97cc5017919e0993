"""`hf-pretrain check`: a pod's worth for a recipe in five minutes, before any data moves in.

command.py      the command: flags -> a `CheckRequest`; `run_check` runs the parts, the verdict, the records
deadline.py     one part in its own process under its own limit, cut and said so when it overruns
worker.py       what that process runs (`python -m hf_pretrain.check.worker PART CONTEXT`)
figures.py      a part's lines on the screen and its figures in the results file, figure by figure
matmul.py       (a) the matmul peak, bf16 and FP8
sdpa.py         (b) SDPA's kernels on the recipe's attention shape: torch's pick, each one's time
synthetic_step.py (c) the recipe's step on synthetic tokens, as training builds it; (d)'s probes
volume_speed.py (e) write and read speed of output_dir's volume at a checkpoint's size
store_rates.py  (f) download and upload rates of an object-store data_dir or output_dir
all_reduce.py   (g) all-reduce bandwidth across this machine's GPUs
verdict.py      $ per billion tokens at the pod's price, rank in plan's table, the slow-node check
"""

from __future__ import annotations

from hf_pretrain.check.command import main

__all__ = ["main"]
