"""`plan` prices a move (economics/egress.py, egress.yaml): the newest checkpoint and the data in GB, at each
store provider's egress rate, 0 where a provider charges none, beside the GPU's $ per billion tokens."""

from __future__ import annotations

import pytest

from hf_pretrain.economics.egress import egress_rates, move_cost


def test_the_1b_moves_its_checkpoint_and_reads_its_data_at_each_providers_rate():
    move = move_cost(1_040_000_000, 11.8e9, vocab_size=32_768)
    assert move.checkpoint_gb == pytest.approx(12.48)  # fp32 weights + AdamW's two moments: 12 bytes a parameter
    assert move.data_gb == pytest.approx(23.6) and move.data_gb_per_billion_tokens == 2  # uint16 tokens
    rows = {provider: (per_gb, per_move, per_billion) for provider, per_gb, per_move, per_billion in move.providers}
    assert rows["aws_s3"] == pytest.approx((0.09, 0.09 * 12.48, 0.18))
    assert rows["cloudflare_r2"] == (0.0, 0.0, 0.0)  # no egress fee: a move costs nothing


def test_a_vocabulary_past_uint16_doubles_the_data():
    assert move_cost(10**9, 1e9, vocab_size=100_000).data_gb_per_billion_tokens == 4


def test_every_provider_states_a_rate_and_its_source():
    rates = egress_rates()
    assert {r.provider for r in rates} >= {"aws_s3", "gcs", "cloudflare_r2", "huggingface"}
    assert all(r.usd_per_gb >= 0 and r.source for r in rates)


def test_plan_prints_the_move_beside_the_gpus_dollars_per_billion_tokens(capsys):
    from hf_pretrain.economics.planning import main

    assert main(["--recipe", "1b", "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("a move to another machine"))
    assert "12.5 GB" in line and "23.6 GB" in line and "the GPU costs $10.66" in line
    assert "aws_s3 $1.12 ($0.090/GB" in line and "cloudflare_r2 $0 (no egress fee)" in line
