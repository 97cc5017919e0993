"""Preflight: cheap checks that refuse a run which is going to die of its plumbing.

Every check is a small function returning a `CheckResult` (pass / warn / fail / skip, with a
reason and a fix). `run_checks` (preflight/checks.py) runs them all; `preflight` also logs the table
and raises `PreflightError` when any check fails, so `train` can stop before a model is built.
`hf-pretrain doctor` (preflight/doctor.py) prints the same table.

The names below load on first use: the checks import torch, and `hf-pretrain doctor --help` must not.
"""

from __future__ import annotations

from hf_pretrain.lazy_exports import lazy_exports

_CHECKS = "hf_pretrain.preflight.checks"
_RESULT = "hf_pretrain.preflight.result"
__all__ = ["MEMORY_PROBE_ENV", "CheckResult", "PreflightError", "format_table", "preflight", "run_checks"]
__getattr__ = lazy_exports(
    __name__,
    {
        "MEMORY_PROBE_ENV": _CHECKS,
        "run_checks": _CHECKS,
        "preflight": _CHECKS,
        "CheckResult": _RESULT,
        "PreflightError": _RESULT,
        "format_table": _RESULT,
    },
)
