"""Preflight: cheap checks that refuse a run which is going to die of its plumbing.

Every check is a small function returning a `CheckResult` (pass / warn / fail / skip, with a
reason and a fix). `run_checks` (preflight/checks.py) runs them all; `preflight` also logs the table
and raises `PreflightError` when any check fails, so `train` can stop before a model is built.
`hf-pretrain doctor` (preflight/doctor.py) prints the same table.

This file imports nothing: the checks import torch, and `hf-pretrain doctor --help` must not; each name is
imported from its own module (`from hf_pretrain.preflight.checks import preflight`).
"""
