"""The pod check's health part (check/gpu_health.py, check/health.py): every threshold, both sides, with a
stand-in NVML; what a machine without a GPU says (one line each); a faulty verdict exits 71."""

from __future__ import annotations

import threading

import pytest

from hf_pretrain.check import gpu_health as health
from hf_pretrain.check.health import LINES, Sampler, static_findings
from hf_pretrain.exit_codes import EXIT_FAULTY_HOST


class NVMLError(Exception):
    pass


class StandInNVML:
    """pynvml's names, answering what a test sets; `missing` names calls the card does not support."""

    NVMLError = NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_TEMPERATURE_GPU, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1

    def __init__(self, missing=(), **answers):
        self.missing = set(missing)
        self.answers = {
            "ecc_mode": [1, 1], "ecc_errors": 0, "remapped": (0, 0, 0, 0), "retired": [], "retired_pending": 0,
            "reasons": 0, "temperature": 60, "slowdown": 87, "link": (5, 16), "max_link": (5, 16),
        } | answers  # fmt: skip

    def _answer(self, call, key):
        if call in self.missing:
            raise NVMLError("Not Supported")
        return self.answers[key]

    def nvmlDeviceGetEccMode(self, handle):
        return self._answer("ecc", "ecc_mode")

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return self._answer("ecc", "ecc_errors")

    def nvmlDeviceGetRemappedRows(self, handle):
        return self._answer("remap", "remapped")

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        return self._answer("retired", "retired")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        return self._answer("retired", "retired_pending")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._answer("clocks", "reasons")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._answer("temperature", "temperature")

    def nvmlDeviceGetTemperatureThreshold(self, handle, kind):
        return self._answer("slowdown", "slowdown")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._answer("pcie", "link")[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._answer("pcie", "link")[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self.answers["max_link"][0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self.answers["max_link"][1]


def test_ecc_any_uncorrected_error_is_faulty_none_is_ok_and_off_is_noted():
    assert health.ecc(1, 1).verdict == health.FAULTY
    assert health.ecc(1, 0).verdict == health.OK
    assert health.ecc(0, 0).verdict == health.NOTED


def test_row_remapping_pending_or_failed_is_faulty_remapped_rows_alone_are_noted():
    assert health.row_remapping(0, 0, 1, 0).verdict == health.FAULTY
    assert health.row_remapping(0, 0, 0, 1).verdict == health.FAULTY
    assert health.row_remapping(3, 0, 0, 0).verdict == health.OK
    assert health.row_remapping(0, 2, 0, 0).verdict == health.NOTED


def test_retired_pages_pending_or_at_the_limit_is_faulty():
    limit = health.RETIRED_PAGES_LIMIT
    assert health.retired_pages(0, 1).verdict == health.FAULTY
    assert health.retired_pages(limit, 0).verdict == health.FAULTY
    assert health.retired_pages(limit - 1, 0).verdict == health.NOTED
    assert health.retired_pages(0, 0).verdict == health.OK


@pytest.mark.parametrize("bit", sorted(health.FAULTY_CLOCK_REASONS))
def test_hardware_and_thermal_slowdowns_under_load_are_faulty(bit):
    assert health.clock_reasons(bit | health.POWER_CAP).verdict == health.FAULTY


def test_the_power_cap_is_noted_and_idle_or_boost_reasons_are_ok():
    assert health.clock_reasons(health.POWER_CAP).verdict == health.NOTED
    assert health.clock_reasons(0x01 | 0x10).verdict == health.OK  # idle, sync boost


def test_temperature_at_the_slowdown_is_faulty_within_the_margin_noted_under_it_ok():
    margin = health.TEMPERATURE_MARGIN_C
    assert health.temperature(87, 87).verdict == health.FAULTY
    assert health.temperature(87 - margin, 87).verdict == health.NOTED
    assert health.temperature(87 - margin - 1, 87).verdict == health.OK
    assert health.temperature(95, None).verdict == health.OK  # no threshold reported: the reading alone


def test_a_pcie_link_under_its_maximum_is_faulty():
    assert health.pcie_link(5, 5, 16, 16).verdict == health.OK
    assert health.pcie_link(4, 5, 16, 16).verdict == health.FAULTY
    assert health.pcie_link(5, 5, 8, 16).verdict == health.FAULTY


def test_the_sustained_matmul_under_90_percent_of_its_kind_is_faulty():
    expected = health.expected_sustained_tflops(989, 0.803)  # gpus.yaml's H100 SXM
    assert expected == pytest.approx(730, abs=1)  # the anchor: ~730 TFLOP/s bf16 sustained
    floor = health.MATMUL_FLOOR * expected
    assert health.sustained_matmul(floor + 1, expected, "H100").verdict == health.OK
    assert health.sustained_matmul(floor - 1, expected, "H100").verdict == health.FAULTY
    assert health.sustained_matmul(500, None, "a card not in the table").verdict == health.UNKNOWN


def test_xid_errors_of_the_hardware_are_faulty_a_programs_noted_an_unreadable_log_says_so():
    line = "[  12.3] NVRM: Xid (PCI:0000:3b:00): {}, pid=1234, name=python"
    assert health.xid_errors(line.format(79)).verdict == health.FAULTY  # fallen off the bus
    assert health.xid_errors(line.format(13)).verdict == health.NOTED  # a program's illegal access
    assert health.xid_errors("nothing here").verdict == health.OK
    unreadable = health.xid_errors(None)
    assert unreadable.verdict == health.UNKNOWN and "not readable" in unreadable.text


def test_nvml_read_through_the_stand_in_judges_each_line():
    found = {f.name: f for f in static_findings(StandInNVML(remapped=(0, 1, 1, 0)), handle=0)}
    assert found["ecc"].verdict == health.OK and found["row remapping"].verdict == health.FAULTY
    assert found["retired pages"].verdict == health.OK


def test_a_reading_the_card_does_not_report_is_one_unknown_line():
    found = {f.name: f for f in static_findings(StandInNVML(missing={"retired"}), handle=0)}
    assert found["retired pages"].verdict == health.UNKNOWN and "not reported here" in found["retired pages"].text


def test_the_sampler_keeps_every_reason_the_hottest_reading_and_the_widest_link_under_load():
    nvml = StandInNVML(reasons=health.POWER_CAP, temperature=70, link=(1, 16))
    sampler = Sampler(nvml, handle=0)
    sampler.sample(loaded=False)  # before the load: an idle card's link says nothing
    nvml.answers |= {"reasons": 0x40, "temperature": 80, "link": (4, 8)}
    sampler.sample()
    nvml.answers |= {"reasons": 0, "temperature": 65, "link": (5, 16)}
    sampler.sample()
    assert sampler.reasons == health.POWER_CAP | 0x40 and sampler.hottest == 80 and sampler.link == (5, 16)
    assert health.clock_reasons(sampler.reasons).verdict == health.FAULTY


class LinkUnderLoad(StandInNVML):
    """The PCIe link generation read `idle_gen` before the load and `loaded_gen` from then on; `loaded` is set
    once it was read under load a few times, which the stand-in load waits for (no sleep that races)."""

    def __init__(self, idle_gen: int, loaded_gen: int):
        super().__init__(link=(idle_gen, 16))
        self.loaded_gen, self.reads = loaded_gen, 0
        self.loaded = threading.Event()

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        generation = self.answers["link"][0]
        self.answers["link"] = (self.loaded_gen, 16)
        self.reads += 1
        if self.reads > 3:
            self.loaded.set()
        return generation


@pytest.mark.parametrize("loaded_gen, verdict", [(5, health.OK), (4, health.FAULTY)])
def test_a_link_lowered_while_idle_is_judged_by_its_readings_under_load(monkeypatch, loaded_gen, verdict):
    """Issue 57: a first reading of gen1, taken before the load (many cards drop their link when idle), then
    gen5 under load was "FAULTY: PCIe link under load: gen1" and exit 71 on every machine. A link that stays
    under its maximum through the load is still faulty."""
    from hf_pretrain.check import health as part

    nvml = LinkUnderLoad(idle_gen=1, loaded_gen=loaded_gen)

    def load(seconds: float) -> float:
        assert nvml.loaded.wait(30), "the sampler never read the link under load"
        return 1.0

    monkeypatch.setattr(part, "sustained_tflops", load)
    found = {f.name: f for f in part.under_load(nvml, handle=0, seconds=1, card="a card")}
    assert found["pcie"].verdict == verdict, found["pcie"]
    assert f"gen{loaded_gen} x16 of gen5 x16" in found["pcie"].text and "gen1" not in found["pcie"].text


def test_without_a_gpu_each_line_says_so_in_one_line(tmp_path):
    from hf_pretrain.check.figures import Report, read_figures
    from hf_pretrain.check.health import measure
    from hf_pretrain.machine.run_profile import THE_CPU

    said = []
    measure(Report("health", tmp_path / "f.jsonl", None, say=said.append), limit_s=10, machine=THE_CPU)
    assert len(said) == len(LINES) and all("skipped: no GPU" in line for line in said), said
    assert {f.name for f in read_figures(tmp_path / "f.jsonl")} == set(LINES)


def test_a_faulty_finding_ends_the_check_with_exit_71(monkeypatch, capsys):
    from hf_pretrain.check import command

    figure = {"part": "health", "name": "ecc", "detail": {"verdict": "faulty"}, "text": "FAULTY: ECC: 2 uncorrected"}
    monkeypatch.setattr(command, "run_check", lambda request: {"figures": [figure], "parts": {}})
    assert command.main(["--recipe", "smoke", "--parts", "health"]) == EXIT_FAULTY_HOST
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "faulty: ECC: 2 uncorrected" in err and "exit 71" in err
