"""Part (h), first of all: is this GPU healthy? What NVML (`nvidia-ml-py`, `import pynvml`) says of the card,
read within the part's limit, and a sustained bf16 matmul during which its clocks are watched. Each finding
is a line, and a verdict: `ok`, `noted` (worth knowing, not a reason to leave), `faulty` (rent another
machine: `hf-pretrain check` then exits 71, exit_codes.EXIT_FAULTY_HOST, and an engine's task relaunches
elsewhere), or `unknown` (not readable here: no GPU, no NVML, a card that does not report it).

The thresholds, each a constant below, both sides tested (tests/test_gpu_health.py, a stand-in NVML):
- ECC: volatile uncorrected errors since the driver loaded: any is faulty; ECC off is noted.
- Row remapping (A100 and later): a remap pending (needs a reset) or a remap that failed: faulty.
- Retired pages (before A100): a retirement pending, or RETIRED_PAGES_LIMIT or more: faulty; fewer noted.
- Clock reasons seen during the sustained matmul: hardware slowdown, hardware or software thermal
  slowdown, power brake: faulty; the software power cap: noted (a card at its power limit is working).
- Temperature during the matmul: at or over the card's slowdown threshold: faulty; within
  TEMPERATURE_MARGIN_C of it: noted.
- PCIe link under load: the best generation and width read during the load under the maximum (a bad
  riser or slot): faulty. A reading taken idle is not judged: an idle card lowers its link to save power.
- The sustained matmul against its kind (gpus.yaml's MAMF x SUSTAINED_SHARE_OF_MAMF: ~730 TFLOP/s bf16
  on an H100 SXM): under MATMUL_FLOOR of it is faulty (healthy peers measure within 10% of each other).
- Xid errors in the kernel log, where it is readable: one of CRITICAL_XIDS is faulty, another noted.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

OK, NOTED, FAULTY, UNKNOWN = "ok", "noted", "faulty", "unknown"
RETIRED_PAGES_LIMIT = 60  # NVIDIA's replacement guidance for cards that retire pages
TEMPERATURE_MARGIN_C = 5
MATMUL_FLOOR = 0.90  # of the expected sustained rate: healthy cards of a kind measure within 10%
SUSTAINED_SHARE_OF_MAMF = 730 / 794.5  # the H100 SXM anchor: ~730 TFLOP/s sustained of its 794.5 MAMF
# Xid codes that mean the hardware (memory, NVLink, the bus, the GSP), not the program: NVIDIA's Xid catalog
CRITICAL_XIDS = {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140}
FAULTY_CLOCK_REASONS = {  # NVML's clocks event (throttle) reason bits
    0x08: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
POWER_CAP = 0x04


@dataclass(frozen=True)
class Finding:
    name: str
    verdict: str
    text: str
    value: float | None = None


def ecc(mode_current: int, uncorrected_volatile: int) -> Finding:
    if uncorrected_volatile > 0:
        return Finding(
            "ecc",
            FAULTY,
            f"ECC: {uncorrected_volatile} uncorrected error(s) since the driver loaded",
            uncorrected_volatile,
        )
    if not mode_current:
        return Finding("ecc", NOTED, "ECC: off (errors in GPU memory go unseen)", 0)
    return Finding("ecc", OK, "ECC: on, no uncorrected error", 0)


def row_remapping(corrected: int, uncorrected: int, pending: int, failed: int) -> Finding:
    rows = f"{corrected} corrected and {uncorrected} uncorrected row(s) remapped"
    if failed:
        return Finding("row remapping", FAULTY, f"row remapping: a remap failed ({rows})", uncorrected)
    if pending:
        return Finding("row remapping", FAULTY, f"row remapping: a remap is pending a GPU reset ({rows})", uncorrected)
    return Finding(
        "row remapping", OK if not uncorrected else NOTED, f"row remapping: none pending ({rows})", uncorrected
    )


def retired_pages(count: int, pending: int) -> Finding:
    if pending:
        return Finding(
            "retired pages", FAULTY, f"retired pages: a retirement is pending a reset ({count} retired)", count
        )
    if count >= RETIRED_PAGES_LIMIT:
        return Finding("retired pages", FAULTY, f"retired pages: {count}, at or over {RETIRED_PAGES_LIMIT}", count)
    return Finding("retired pages", NOTED if count else OK, f"retired pages: {count}", count)


def clock_reasons(seen: int) -> Finding:
    """Every reason bit seen in the samples taken during the sustained matmul, OR-ed."""
    faulty = [name for bit, name in FAULTY_CLOCK_REASONS.items() if seen & bit]
    if faulty:
        return Finding("clocks", FAULTY, f"clocks under load: {', '.join(faulty)}", seen)
    if seen & POWER_CAP:
        return Finding("clocks", NOTED, "clocks under load: held at the power cap (normal for a busy card)", seen)
    return Finding("clocks", OK, "clocks under load: no slowdown", seen)


def temperature(hottest_c: float, slowdown_c: float | None) -> Finding:
    if slowdown_c is None:
        return Finding("temperature", OK, f"temperature under load: {hottest_c:.0f} C", hottest_c)
    if hottest_c >= slowdown_c:
        verdict = FAULTY
    elif hottest_c >= slowdown_c - TEMPERATURE_MARGIN_C:
        verdict = NOTED
    else:
        verdict = OK
    text = f"temperature under load: {hottest_c:.0f} C (slowdown at {slowdown_c:.0f} C)"
    return Finding("temperature", verdict, text, hottest_c)


def pcie_link(generation: int, max_generation: int, width: int, max_width: int) -> Finding:
    text = f"PCIe link under load: gen{generation} x{width} of gen{max_generation} x{max_width}"
    short = generation < max_generation or width < max_width
    return Finding("pcie", FAULTY if short else OK, text + (" (a bad riser or slot?)" if short else ""), width)


def sustained_matmul(tflops: float, expected_tflops: float | None, card: str) -> Finding:
    if not expected_tflops:
        return Finding(
            "matmul", UNKNOWN, f"sustained bf16 matmul: {tflops:,.0f} TFLOP/s ({card}: no expected figure)", tflops
        )
    share = tflops / expected_tflops
    verdict = FAULTY if share < MATMUL_FLOOR else OK
    text = f"sustained bf16 matmul: {tflops:,.0f} TFLOP/s, {share:.0%} of the ~{expected_tflops:,.0f} a healthy {card} sustains"
    return Finding("matmul", verdict, text, tflops)


def expected_sustained_tflops(bf16_tflops: float | None, matmul_efficiency: float | None) -> float | None:
    """The sustained bf16 matmul a healthy card of its kind reaches: its MAMF (gpus.yaml) x the anchor's share."""
    if not bf16_tflops or not matmul_efficiency:
        return None
    return bf16_tflops * matmul_efficiency * SUSTAINED_SHARE_OF_MAMF


XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")


def xid_errors(kernel_log: str | None) -> Finding:
    if kernel_log is None:
        return Finding(
            "xid", UNKNOWN, "Xid errors: the kernel log is not readable here (dmesg needs root): not checked"
        )
    codes = sorted({int(code) for code in XID.findall(kernel_log)})
    critical = [c for c in codes if c in CRITICAL_XIDS]
    if critical:
        return Finding(
            "xid",
            FAULTY,
            f"Xid errors in the kernel log: {', '.join(map(str, codes))} (hardware: {critical})",
            len(codes),
        )
    if codes:
        return Finding(
            "xid",
            NOTED,
            f"Xid errors in the kernel log: {', '.join(map(str, codes))} (a program's, not the card's)",
            len(codes),
        )
    return Finding("xid", OK, "Xid errors: none in the kernel log", 0)


def read_kernel_log(timeout_s: float = 5.0) -> str | None:
    """`dmesg`, or None where it cannot be read (not root, a container)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
