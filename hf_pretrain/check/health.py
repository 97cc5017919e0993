"""Part (h), the health of the GPU: NVML read (check/gpu_health.py judges each reading), then a sustained
bf16 matmul during which a thread samples the clock reasons, the temperature and the PCIe link (an idle card
lowers its link and clocks: only a loaded one says the truth). Without a GPU or NVML, each line says so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hf_pretrain.check import gpu_health as health
from hf_pretrain.check.figures import Report
from hf_pretrain.machine.run_profile import Machine

LINES = ("ecc", "row remapping", "retired pages", "clocks", "temperature", "pcie", "matmul", "xid")
MATMUL_SIZE = 8192
SAMPLE_S = 0.2


def measure(report: Report, limit_s: float, machine: Machine, nvml=None) -> list[health.Finding]:
    """Every line said and written; the findings returned. `machine`: the worker's (check/worker.py);
    `nvml`: the binding (a stand-in in tests)."""
    import torch

    if not machine.on_gpu:
        return skip_all(report, "no GPU (NVML reads a GPU's health)")
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return skip_all(report, "NVML's binding is missing: pip install nvidia-ml-py")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return skip_all(report, f"NVML did not start ({exc})")
    try:
        handle = nvml_handle(nvml, torch)
        findings = static_findings(nvml, handle)
        findings += under_load(nvml, handle, min(20.0, 0.6 * limit_s), report.device or "this GPU")
        findings.append(health.xid_errors(health.read_kernel_log()))
    finally:
        nvml.nvmlShutdown()
    for finding in findings:
        say(report, finding)
    return findings


def nvml_handle(nvml, torch):
    """NVML's handle of the GPU torch computes on: by its UUID (CUDA_VISIBLE_DEVICES renumbers CUDA's
    indices, never NVML's), else by index where torch does not say the UUID."""
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    if uuid is not None:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def skip_all(report: Report, reason: str) -> list[health.Finding]:
    for name in LINES:
        report.skip(name, f"skipped: {reason}")
    return []


def say(report: Report, finding: health.Finding) -> None:
    mark = {health.FAULTY: "FAULTY: ", health.NOTED: "noted: "}.get(finding.verdict, "")
    if finding.value is None:
        report.skip(finding.name, f"{mark}{finding.text}")
    else:
        report.figure(finding.name, finding.value, "", f"{mark}{finding.text}", verdict=finding.verdict)


def read(nvml, name: str, call: Callable[[], health.Finding]) -> health.Finding:
    """One reading judged; a card or driver that does not report it: one `unknown` line."""
    try:
        return call()
    except nvml.NVMLError as exc:
        return health.Finding(name, health.UNKNOWN, f"{name}: not reported here ({exc})")


def static_findings(nvml, handle) -> list[health.Finding]:
    def ecc():
        errors = nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        return health.ecc(nvml.nvmlDeviceGetEccMode(handle)[0], errors)

    def retired():
        pages = nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        return health.retired_pages(len(pages), nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))

    return [
        read(nvml, "ecc", ecc),
        read(nvml, "row remapping", lambda: health.row_remapping(*nvml.nvmlDeviceGetRemappedRows(handle))),
        read(nvml, "retired pages", retired),
    ]


class Sampler(threading.Thread):
    """Clock reasons (OR-ed), the hottest temperature and the widest PCIe link seen under load.

    The link is the best reading, generation and width each, and only of readings taken under load: a card
    lowers its link when idle (power saving), so a reading before the load (gen1 on a healthy gen5 card)
    said nothing, and one such reading sent every machine away (issue 57). A link that stays under its
    maximum through the whole load is a bad riser or slot."""

    def __init__(self, nvml, handle):
        super().__init__(daemon=True)
        self.nvml, self.handle, self.stop = nvml, handle, threading.Event()
        self.reasons, self.hottest, self.link = 0, 0.0, None
        self.errors: dict[str, str] = {}

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.sample()

    def sample(self, loaded: bool = True) -> None:
        """One reading of each; `loaded=False`: taken before the load (its link is not judged)."""
        nvml, handle = self.nvml, self.handle
        for name, take in (
            ("clocks", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            ("temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            (
                "pcie",
                lambda: (nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle), nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            ),
        ):
            try:
                value = take()
            except nvml.NVMLError as exc:
                self.errors[name] = str(exc)
                continue
            if name == "clocks":
                self.reasons |= int(value)
            elif name == "temperature":
                self.hottest = max(self.hottest, float(value))
            elif loaded:
                self.link = value if self.link is None else (max(self.link[0], value[0]), max(self.link[1], value[1]))


def sustained_tflops(seconds: float) -> float:
    import torch

    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10):
            torch.mm(a, b)
        torch.cuda.synchronize()
        done += 10
    return 2 * MATMUL_SIZE**3 * done / (time.perf_counter() - started) / 1e12


def under_load(nvml, handle, seconds: float, card: str) -> list[health.Finding]:
    from hf_pretrain.machine.gpus import find_gpu

    sampler = Sampler(nvml, handle)
    sampler.sample(loaded=False)  # what the card reports at all (a reading it does not support: said once)
    sampler.start()
    try:
        tflops = sustained_tflops(seconds)
        if sampler.link is None:  # a load shorter than a sample: one reading as it ends, its link still up
            sampler.sample()
    finally:
        sampler.stop.set()
        sampler.join()
    gpu = find_gpu(card)
    expected = health.expected_sustained_tflops(gpu.bf16_flops / 1e12, gpu.matmul_efficiency) if gpu else None
    findings = [health.sustained_matmul(tflops, expected, card)]
    for name, judge in (
        ("clocks", lambda: health.clock_reasons(sampler.reasons)),
        ("temperature", lambda: health.temperature(sampler.hottest, slowdown(nvml, handle))),
        ("pcie", lambda: pcie(nvml, handle, sampler.link)),
    ):
        if name in sampler.errors:
            findings.append(health.Finding(name, health.UNKNOWN, f"{name}: not reported here ({sampler.errors[name]})"))
        else:
            findings.append(read(nvml, name, judge))
    return findings


def slowdown(nvml, handle) -> float | None:
    try:
        return float(nvml.nvmlDeviceGetTemperatureThreshold(handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
    except nvml.NVMLError:
        return None


def pcie(nvml, handle, link) -> health.Finding:
    generation, width = link
    return health.pcie_link(
        generation, nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle), width, nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
    )
