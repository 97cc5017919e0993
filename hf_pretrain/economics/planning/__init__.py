"""`hf-pretrain plan`: what a run will take before it starts (tokens, FLOPs, time, money on 1..N GPUs), or
what going further would buy a run under way.

plan_command.py  the command: its flags, parsed into a `PlanRequest` (or `--run`'s folder), the plan printed
request.py       `PlanRequest`: what is planned and how it would run, checked when built; the defaults
plan.py          `make_plan`: the request's `Plan`, every figure from the modules below
scaling_laws.py  Chinchilla: tokens per parameter, C = 6ND, the compute-optimal split, its fitted loss
gpu_ranking.py   the recipe on each GPU of the table: its fit, its rate (measured, else modelled), its dollars
data_parallel.py time and cost on 1..N GPUs: one ring all-reduce of the gradients per step, not overlapped
further.py       `plan --run`: what going on to more tokens buys a run, from its own loss curve and pace
printing.py      the plans as text: the markdown tables, the FP8 line, the `--run` forecast
"""

from __future__ import annotations

from hf_pretrain.economics.planning.plan_command import main

__all__ = ["main"]
