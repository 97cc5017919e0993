"""What a precision is has one home (hf_pretrain/machine/precisions.py, issue 39): the recipe's choices and the
table name the same precisions, and a precision like fp8 added as a row of the table alone is priced,
checked and converted as fp8 is, by readers that never name it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from accelerate.utils import PrecisionType

from hf_pretrain.config import load_recipe
from hf_pretrain.config.compute_section import SCALED_MATMUL_CHOICES, ComputeConfig
from hf_pretrain.economics import performance
from hf_pretrain.economics.planning.gpu_ranking import gpu_row, quality_per_token
from hf_pretrain.economics.planning.printing import converting_precision
from hf_pretrain.machine import precisions
from hf_pretrain.machine.gpus import GPU, gpu_named
from hf_pretrain.machine.precisions import PRECISIONS, precision_named
from hf_pretrain.machine.run_profile import (
    THE_CPU,
    accelerate_word,
    machine_with,
    resolve_precision,
    run_profile,
)
from hf_pretrain.model.fp8 import fp8_handlers
from hf_pretrain.preflight.dependencies import check_versions
from hf_pretrain.preflight.gpu import check_fp8
from tests.helpers import CARD, card_sections, estimate_memory, h100_workload, section_on_cpu


def test_the_recipe_choices_and_the_table_name_the_same_precisions():
    """config/ is a leaf and cannot import the table: its Literal and its list of scaled-matmul choices are
    held to the table's rows here."""
    choices = set(typing.get_args(typing.get_type_hints(ComputeConfig)["mixed_precision"]))
    named = {resolve_precision(choice, machine_with(CARD)) for choice in choices - {"auto"}}
    assert named == set(precisions.NAMES) and len(choices) == len(PRECISIONS) + 1  # + auto; `no` is fp32
    assert set(SCALED_MATMUL_CHOICES) == {p.name for p in PRECISIONS if p.converts_linears} == {"fp8"}


def test_each_row_names_a_peak_of_the_gpu_table_and_an_accelerate_word():
    columns = {f.name for f in dataclasses.fields(GPU)}
    for p in PRECISIONS:
        assert f"{p.peak}_flops" in columns, p.name  # GPU.flops_at(p.peak)
        assert p.accelerate in PrecisionType.list(), p.name  # a word the installed Accelerate knows
        assert accelerate_word(p.name) == p.accelerate
    assert [p.name for p in PRECISIONS if not p.autocasts] == ["fp32"]
    assert {p.name: p.activation_bytes for p in PRECISIONS} == {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}
    with pytest.raises(KeyError):
        precision_named("auto")  # the run profile's word to resolve, not a row


# ---------------------------------------------------------------------- a stand-in: fp8 under another name
@pytest.fixture
def mxfp8(monkeypatch):
    """`mxfp8`: fp8's row under another name, added to the table and nowhere else; a recipe that asks it (the
    Literal would refuse it at parse time: adding one for real adds its choice there too)."""
    row = dataclasses.replace(precision_named("fp8"), name="mxfp8")
    monkeypatch.setattr(precisions, "_BY_NAME", {**precisions._BY_NAME, "mxfp8": row})
    monkeypatch.setattr(precisions, "PRECISIONS", (*PRECISIONS, row))
    return lambda name="1b", **keys: load_recipe(name, keys).replace(mixed_precision="mxfp8")


def test_a_row_alone_is_priced_like_fp8_by_the_performance_model_and_plan(mxfp8, monkeypatch):
    fp8, stand_in = load_recipe("1b", {"mixed_precision": "fp8"}), mxfp8()
    h100, a100 = gpu_named("H100"), gpu_named("A100 80GB SXM")
    assert run_profile(stand_in.step_as_written, machine_with(h100)).precision == "mxfp8"
    assert performance.modelled_tokens_per_s(h100_workload(stand_in), h100) == performance.modelled_tokens_per_s(
        h100_workload(fp8), h100
    )
    memory = [dataclasses.replace(estimate_memory(r, 32768, CARD), kind=None) for r in (stand_in, fp8)]
    assert memory[0] == memory[1]
    with pytest.raises(ValueError, match="mixed_precision=mxfp8 needs FP8 tensor cores"):
        performance.modelled_tokens_per_s(h100_workload(stand_in), a100)
    assert (
        quality_per_token(run_profile(stand_in.step_as_written, machine_with(CARD)).step)
        == quality_per_token(run_profile(fp8.step_as_written, machine_with(CARD)).step)
        < 1.0
    )
    row = gpu_row(a100, 1e9, 1.0, **card_sections(stand_in))
    assert not row.fits and row.reason == "no MXFP8: compute capability 8.0 (mxfp8 needs 8.9+)"
    monkeypatch.setattr("hf_pretrain.economics.planning.printing.PRECISIONS", precisions.PRECISIONS)
    assert (
        converting_precision(run_profile(stand_in.step_as_written, machine_with(CARD)).step.describe()).name == "mxfp8"
    )


def test_a_row_alone_is_checked_and_converted_like_fp8(mxfp8):
    stand_in = mxfp8("smoke", fp8_emulate=True)
    step = run_profile(stand_in.step_as_written, THE_CPU).step
    assert (step.fp8_recipe, step.fp8_emulate, run_profile(stand_in.step_as_written, THE_CPU).accelerate_precision) == (
        "tensorwise",
        True,
        "fp8",
    )
    result = check_fp8(run_profile(stand_in.step_as_written, THE_CPU))
    assert result.status == "pass" and result.reason.startswith("mxfp8 emulated"), result
    not_emulated = mxfp8("smoke")
    result = check_fp8(run_profile(not_emulated.step_as_written, THE_CPU))
    assert result.status == "fail" and "mixed_precision=mxfp8 needs FP8 tensor cores" in result.reason
    assert "torchao" in {r.name for r in check_versions(*section_on_cpu(stand_in, "compute"))}
    assert len(fp8_handlers(step)) == 1  # torchao's converter, as for fp8
