"""Installed versions of the stack against the ranges the package metadata declares.

pyproject.toml stays the single source of truth: the ranges are read back from the installed
`hf-pretrain` metadata (`importlib.metadata.requires`), and Triton's from Liger's own metadata.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from hf_pretrain.config import ComputeConfig
from hf_pretrain.machine.precisions import Precision
from hf_pretrain.machine.run_profile import RunProfile
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.versions import installed_version

CORE_PACKAGES = ["torch", "transformers", "accelerate", "datasets", "tokenizers"]
INSTALL_FIX = "pip install -c constraints.txt -e .  (constraints.txt pins the tested set)"
LIGER_INSTALL_FIX = "pip install -c constraints.txt -e '.[liger]' on a CUDA machine, or --liger false"


def declared_ranges(distribution: str) -> dict[str, SpecifierSet]:
    """Supported range per dependency of an installed distribution (extras included, markers ignored)."""
    ranges: dict[str, SpecifierSet] = {}
    for line in metadata.requires(distribution) or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        ranges[canonicalize_name(requirement.name)] = requirement.specifier
    return ranges


def check_package(package: str, supported: SpecifierSet | None, fix: str) -> CheckResult:
    """Fail when `package` is missing or outside `supported`; no range means any version will do."""
    version = installed_version(package)
    wanted = str(supported) if supported else "any version"
    if version is None:
        return CheckResult(package, "fail", f"not installed (needed: {wanted})", fix)
    if supported is not None and not supported.contains(version, prereleases=True):
        return CheckResult(package, "fail", f"{version} is outside the supported range {wanted}", fix)
    return CheckResult(package, "pass", f"{version} (supported: {wanted})")


def check_liger_torch(liger_ranges: dict[str, SpecifierSet]) -> CheckResult | None:
    """Warn when torch lies outside the range Liger declares: its Triton kernels are tested per torch release."""
    torch_range, torch_version = liger_ranges.get("torch"), installed_version("torch")
    if not torch_range or torch_version is None or torch_range.contains(torch_version, prereleases=True):
        return None
    return CheckResult(
        "liger + torch",
        "warn",
        f"torch {torch_version} is outside liger-kernel's tested torch range {torch_range}",
        "use the torch that constraints.txt pins, or --liger false",
    )


def check_versions(compute: ComputeConfig, profile: RunProfile) -> list[CheckResult]:
    """One row per package the run imports; Liger's and Triton's only when the compute section turns Liger
    on (asked, wherever it runs), a precision's own (torchao for fp8: precisions.py) only when the run's
    profile trains in it (fp8 is only ever asked by name, so any machine's profile says the same)."""
    try:
        ranges = declared_ranges("hf-pretrain")
    except metadata.PackageNotFoundError:
        return [
            CheckResult(
                "versions", "fail", "hf-pretrain is not installed, so its supported ranges are unknown", INSTALL_FIX
            )
        ]
    results = [check_package(p, ranges.get(p), INSTALL_FIX) for p in CORE_PACKAGES]
    if compute.liger:
        liger = check_package("liger-kernel", ranges.get("liger-kernel"), LIGER_INSTALL_FIX)
        liger_ranges = declared_ranges("liger-kernel") if liger.status == "pass" else {}
        results += [liger, check_package("triton", liger_ranges.get("triton"), LIGER_INSTALL_FIX)]
        torch_warning = check_liger_torch(liger_ranges)
        if torch_warning:
            results.append(torch_warning)
    precision = profile.step.precision_facts
    if precision.package:  # fp8: torchao's float8 layers, through Accelerate's torchao backend
        results.append(check_precision_package(precision, ranges.get(precision.package)))
    return results


def check_precision_package(precision: Precision, supported: SpecifierSet | None) -> CheckResult:
    """The package a precision's converter needs (torchao for fp8) installed, in range, and importable:
    each torchao release is built against one torch, and a mismatch shows only at import (the run would
    die in `prepare`)."""
    package = precision.package
    fix = f"pip install -c constraints.txt -e '.[{precision.extra}]', or --mixed_precision bf16"
    result = check_package(package, supported, fix)
    if result.status != "pass":
        return result
    try:
        importlib.import_module(precision.module)
    except Exception as exc:  # an ImportError, or a torch op torchao registers that this torch lacks
        first_line = (str(exc).splitlines() or [""])[0][:200]
        return CheckResult(
            package,
            "fail",
            f"{installed_version(package)} does not import with torch {installed_version('torch')}: "
            f"{type(exc).__name__}: {first_line}",
            fix,
        )
    return result
