"""`hf-pretrain bench`, `plan` and `report`: the formulas against hand-computed values, a real bench
of the smoke recipe on CPU (variants and the memory-bounded micro-batch search), and a report
written from a synthetic run folder."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from hf_pretrain import bench
from hf_pretrain.bench.search import largest_fitting
from hf_pretrain.bench.variants import variant_grid
from hf_pretrain.config import load_recipe
from hf_pretrain.economics.cost import Phase, phase_row
from hf_pretrain.economics.measurements import timed_throughput
from hf_pretrain.economics.planning import data_parallel, plan, plan_command, scaling_laws
from hf_pretrain.economics.planning.request import DEFAULT_GLOBAL_BATCH_TOKENS, PlanRequest
from hf_pretrain.economics.prices import PriceError, parse_price, price_table
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.machine.gpus import best_match, find_gpu
from hf_pretrain.run_commands import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------- plan: formulas by hand
def test_chinchilla_and_the_compute_optimal_fit():
    assert scaling_laws.chinchilla_tokens(1.04e9) == pytest.approx(20.8e9)
    assert scaling_laws.training_flops(1e9, 2e10) == pytest.approx(1.2e20)
    # G = (0.3478 * 482.01 / (0.3658 * 2085.43))^(1 / 0.7136) = 0.119630; N_opt = G (1e20 / 6)^(0.3658 / 0.7136)
    n_opt, d_opt = scaling_laws.compute_optimal(1e20)
    assert n_opt == pytest.approx(0.119630 * (1e20 / 6) ** (0.3658 / 0.7136), rel=1e-4)
    assert n_opt * d_opt == pytest.approx(1e20 / 6)


def test_throughput_from_mfu_and_the_ring_all_reduce():
    # 40% of 989 TFLOP/s over 6.24 GFLOP per token
    assert plan.tokens_per_s_at_mfu(989e12, 0.4, 6.24e9) == pytest.approx(63_397.4, rel=1e-5)
    # 8 GPUs each send 2 * 7/8 * 4 GB = 7 GB over 3600 Gbit/s = 450 GB/s
    assert data_parallel.ring_allreduce_seconds(8, 4e9, 3600) == pytest.approx(7e9 / 450e9)
    assert data_parallel.ring_allreduce_seconds(1, 4e9, 3600) == 0.0


def test_more_gpus_buy_time_not_money():
    # 1e9 tokens at 10,000 tokens/s per GPU, $2/h, 1,000 steps, 4 GB of gradients over 100 Gbit/s
    one = data_parallel.scaling_row(1, 1e9, 10_000, 2.0, 1000, 4e9, 100)
    assert (one.hours, one.communication_hours, one.cost, one.cost_vs_one_gpu) == pytest.approx(
        (100_000 / 3600, 0.0, 2 * 100_000 / 3600, 1.0)
    )
    two = data_parallel.scaling_row(2, 1e9, 10_000, 2.0, 1000, 4e9, 100)
    # compute 50,000 s; each step's all-reduce sends 2 * 1/2 * 4e9 bytes at 12.5e9 B/s = 0.32 s
    assert two.compute_hours == pytest.approx(50_000 / 3600)
    assert two.communication_hours == pytest.approx(320 / 3600)
    assert two.hours == pytest.approx(50_320 / 3600)
    assert two.cost == pytest.approx(50_320 / 3600 * 2 * 2.0)
    assert two.cost_vs_one_gpu == pytest.approx(50_320 * 2 / 100_000)
    assert two.tokens_per_s == pytest.approx(1e9 / 50_320)


def test_plan_command_json(capsys):
    assert (
        plan_command.main(
            [
                "--params",
                "1e9",
                "--tokens_per_s",
                "10000",
                "--price_per_gpu_hour",
                "2",
                "--max_gpus",
                "2",
                "--interconnect",
                "ethernet",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == pytest.approx(2e10)  # 20 tokens per parameter by default
    assert result["flops_per_token"] == pytest.approx(6e9)
    assert result["usd_per_billion_tokens"] == pytest.approx(2 * 1e9 / 10_000 / 3600)
    assert result["optimizer_steps"] == math.ceil(2e10 / DEFAULT_GLOBAL_BATCH_TOKENS)
    one, two = result["scaling"]
    assert one["hours"] == pytest.approx(2e10 / 10_000 / 3600)
    assert one["cost"] == pytest.approx(2e10 / 10_000 / 3600 * 2)
    # fp32 gradients: 4 bytes per parameter over 100 Gbit/s, 2 * 1/2 of them per step
    per_step = 4e9 / 12.5e9
    assert two["communication_hours"] == pytest.approx(result["optimizer_steps"] * per_step / 3600)
    assert two["cost_vs_one_gpu"] > 1.0


def test_plan_from_a_recipe_and_a_named_gpu(capsys):
    assert plan_command.main(["--recipe", "smoke", "--gpu", "A100 80GB", "--max_gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "recipe smoke" in out and "A100 80GB" in out and "$1.79/h" in out and "| 1 |" in out


def _plan_json(capsys, argv):
    assert plan_command.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_takes_recipe_overrides_like_every_recipe_command(capsys):
    recipe = load_recipe("smoke")
    as_written = _plan_json(capsys, ["--recipe", "smoke"])
    assert as_written["optimizer_steps"] == recipe.train.max_steps
    longer = _plan_json(capsys, ["--recipe", "smoke", "--max_steps", "500"])
    assert longer["optimizer_steps"] == 500 and longer["tokens"] == 500 * recipe.train.global_batch_tokens
    assert longer["parameters"] == as_written["parameters"]
    # a key of the model changes its size and FLOPs; a recipe key and a plan flag mix freely
    deeper = _plan_json(capsys, ["--recipe", "smoke", "--num_hidden_layers", "8", "--tokens_per_s", "1000"])
    assert deeper["parameters"] > as_written["parameters"] and deeper["flops_per_token"] > as_written["flops_per_token"]
    assert deeper["tokens_per_s_per_gpu"] == 1000 and deeper["throughput_source"] == "--tokens_per_s"
    # the recipe's own price and rate keys feed the plan when no flag says otherwise
    priced = _plan_json(capsys, ["--recipe", "smoke", "--price_per_hour", "3", "--expected_tokens_per_s", "2000"])
    assert priced["price_per_gpu_hour"] == 3 and priced["tokens_per_s_per_gpu"] == 2000


@pytest.mark.parametrize(
    "argv, said, code",
    [
        (["--recipe", "smoke", "--max_stepz", "500"], "unknown key `max_stepz` (did you mean `max_steps`?)", 2),
        (["--recipe", "smoke", "--max_steps", "0"], "max_steps", EXIT_CONFIG),  # checked like any run of the recipe
        (["--params", "1e9", "--max_steps", "500"], "unknown key `max_steps`", 2),  # no recipe, no recipe keys
    ],
)
def test_plan_refuses_an_unknown_recipe_key_naming_it(capsys, argv, said, code):
    with pytest.raises(SystemExit) as exited:  # the parser's refusal, as in every recipe command
        plan_command.main(argv)
    assert exited.value.code == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_plan_refuses_two_models_and_bad_numbers(capsys):
    assert plan_command.main(["--recipe", "smoke", "--params", "1e9"]) == EXIT_CONFIG
    assert "--recipe and --params" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # refused as it is parsed, as every numeric flag is
        plan_command.main(["--params", "1e9", "--tokens", "-5"])
    assert refused.value.code == EXIT_CONFIG and "tokens=-5 must be > 0" in capsys.readouterr().err
    assert plan_command.main(["--params", "1e9", "--price_per_hour", "3"]) == EXIT_CONFIG
    assert "--price_per_hour goes with --run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--max_gpus"):
        PlanRequest(params=1e9, max_gpus=0)
    with pytest.raises(ValueError, match="one of them"):
        PlanRequest()


def test_a_plan_request_plans_without_a_command_line():
    request = PlanRequest(params=1e9, tokens=2e10, tokens_per_s=10_000, price_per_gpu_hour=2.0, max_gpus=1)
    result = plan.make_plan(request)
    assert result.flops_per_token == pytest.approx(6e9) and result.total_flops == pytest.approx(1.2e20)
    assert result.gradient_bytes == pytest.approx(4e9)  # fp32 gradients all-reduced
    assert result.scaling[0].cost == pytest.approx(2e10 / 10_000 / 3600 * 2.0)


def test_plan_without_throughput_says_what_time_and_cost_need(capsys):
    assert plan_command.main(["--params", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "time and cost: unknown" in out and "--tokens_per_s" in out and "| GPUs |" not in out


# ---------------------------------------------------------------------- prices
def test_price_table_and_gpu_names(tmp_path):
    table = price_table(extra=["My H100=2.10"])
    assert table["My H100"] == 2.10 and table["H100 SXM"] > 0  # the GPU table's typical prices
    assert find_gpu("NVIDIA A100-SXM4-80GB").name == "A100 80GB SXM"
    assert find_gpu("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert find_gpu("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert find_gpu("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert find_gpu("NVIDIA L4").name == "L4" and find_gpu("NVIDIA L40S").name == "L40S"
    assert find_gpu("NVIDIA GeForce RTX 4090").name == "RTX 4090" and find_gpu("NVIDIA A10G").name == "A10G"
    assert find_gpu("NVIDIA RTX 6000 Ada Generation").name == "RTX 6000 Ada"
    assert find_gpu("NVIDIA RTX A6000").name == "RTX A6000" and find_gpu("Tesla V100-SXM2-16GB") is None
    assert best_match("NVIDIA L40S", ["L4", "L40S"]) == "L40S"
    assert best_match("NVIDIA L40S", ["L4"]) is None
    custom = tmp_path / "prices.yaml"
    custom.write_text("cheap: 0.5\n")
    assert price_table(custom) == {"cheap": 0.5}
    for bad in ("H100", "H100=free", "=2"):
        with pytest.raises(PriceError):
            parse_price(bad)
    custom.write_text("broken: -1\n")
    with pytest.raises(PriceError, match="broken"):
        price_table(custom)


# ---------------------------------------------------------------------- bench: pure parts
def test_variant_grid_is_every_combination():
    grid = variant_grid(["gradient_checkpointing=true,false", "micro_batch_size=4,8"])
    assert grid == [
        {"gradient_checkpointing": "true", "micro_batch_size": "4"},
        {"gradient_checkpointing": "true", "micro_batch_size": "8"},
        {"gradient_checkpointing": "false", "micro_batch_size": "4"},
        {"gradient_checkpointing": "false", "micro_batch_size": "8"},
    ]
    assert variant_grid(["gradient-checkpointing=true,false", "micro-batch-size=4,8"]) == grid  # as flags read
    assert variant_grid([]) == [{}]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        variant_grid(["compile"])


@pytest.mark.parametrize("limit, start, expected", [(37, 8, 37), (5, 8, 5), (0, 8, None), (500, 8, 100), (64, 64, 64)])
def test_largest_fitting_doubles_then_bisects(limit, start, expected):
    probed = []

    def fits(size):
        probed.append(size)
        return size <= limit

    assert largest_fitting(list(range(1, 101)), start, fits) == expected
    assert len(probed) == len(set(probed)), "a size was probed twice"
    assert len(probed) <= 2 * math.log2(100) + 2


def test_timed_throughput_leaves_the_warmup_out():
    records = [
        {"kind": "train", "step": s, "tokens": 100 * s, "tokens_per_s": rate, "data_wait_share": wait}
        for s, rate, wait in [(1, 10, 0.9), (2, 100, 0.1), (3, 50, 0.4)]
    ]
    rate, step_seconds, wait = timed_throughput(records + [{"kind": "eval", "step": 3}], warmup=1)
    # steps 2 and 3: 200 tokens in 1 s + 2 s
    assert (rate, step_seconds) == pytest.approx((200 / 3, 1.5))
    assert wait == pytest.approx((0.1 * 1 + 0.4 * 2) / 3)
    assert timed_throughput(records, warmup=3) is None
    no_wait = [{k: v for k, v in r.items() if k != "data_wait_share"} for r in records]
    assert timed_throughput(no_wait, warmup=1)[2] is None


def test_bench_rejects_a_malformed_variant(capsys, tmp_path):
    assert bench.main(["--recipe", "smoke", "--variants", "compile", "--output", str(tmp_path)]) == EXIT_CONFIG
    assert "KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_two_benches_into_one_output_are_locked_like_training_folders(smoke_data, tmp_path):
    """Issue 38: a second bench into the same --output ran, and one failed pointing at the other's log.
    Now the second is refused at once with exit 73 naming the first, which goes on untouched."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from hf_pretrain.exit_codes import EXIT_LOCKED
    from tests.helpers import OUTSIDE_CHECKOUT, offline_env, run_captured

    out = tmp_path / "bench"
    command = [sys.executable, "-m", "hf_pretrain.cli", "bench", "--recipe", "smoke", "--data_dir", str(smoke_data)]
    command += ["--steps", "200", "--warmup", "1", "--memory_gib", "0.7", "--output", str(out)]
    env = {**offline_env(), "HF_PRETRAIN_HOME": str(tmp_path / "home")}
    first = subprocess.Popen(
        command,
        cwd=OUTSIDE_CHECKOUT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while f'"pid": {first.pid}' not in ((out / "run.lock").read_text() if (out / "run.lock").exists() else ""):
            assert first.poll() is None and time.monotonic() < deadline, "the first bench never held its --output"
            time.sleep(0.1)
        second = run_captured(command, OUTSIDE_CHECKOUT, env, timeout=120)
        assert second.returncode == EXIT_LOCKED, second.stderr
        assert f"in use by another bench: pid {first.pid}" in second.stderr and "--output" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first goes on
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


# ---------------------------------------------------------------------- bench: a real CPU run
@pytest.mark.slow
def test_bench_smoke_measures_variants_and_finds_the_largest_micro_batch(smoke_data, tmp_path, monkeypatch):
    """Two variants and a micro-batch search bounded by a CPU memory budget. The smoke model
    needs ~15 MiB of RSS per sequence on top of the interpreter's ~0.45 GiB, so 0.7 GiB stops the
    search below the recipe's whole batch (32 sequences)."""
    budget = 0.7
    out = tmp_path / "bench"
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    code = bench.main(
        [
            "--recipe",
            "smoke",
            "--data_dir",
            str(smoke_data),
            "--variants",
            "gradient_checkpointing=true,false",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--memory_gib",
            str(budget),
            "--gpu_price",
            "test-gpu=1.5",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "bench.json").read_text())
    assert (out / "bench.md").read_text().startswith("# hf-pretrain bench: smoke")
    assert result["peak_flops"]["measured"] > 0 and result["peak_flops"]["datasheet"] is None  # CPU

    recipe, checkpointed = result["variants"][:2]
    assert recipe["name"] == "recipe as written" and checkpointed["name"] == "gradient_checkpointing=true"
    for variant in result["variants"]:
        assert variant["status"] == "ok", variant["message"]
        assert variant["tokens_per_s"] > 0 and variant["step_seconds"] > 0
        assert 0 < variant["mfu_measured_peak"] < 1 and variant["mfu"] is None  # no datasheet peak on CPU
        assert 0.1 < variant["peak_memory_gib"] < 8
        assert 0 <= variant["data_wait_share"] <= 1
        # a CPU's speed prices no GPU, measured or estimated (issue 32: an A40 at the H100's speed)
        assert variant["usd_per_billion_tokens"] == {} and variant["usd_per_billion_tokens_estimated"] == {}
    assert "a CPU figure" in result["peak_flops"]["measured_with"]
    assert "a CPU, whose speed says nothing of a GPU's" in (out / "bench.md").read_text()
    assert not (tmp_path / "home").exists() and not list(out.rglob("measurements.jsonl"))  # a CPU records nothing

    search = result["micro_batch_search"]
    assert search["candidates"] == [1, 2, 4, 8, 16, 32] and search["memory_budget_gib"] == budget
    probes = {p["micro_batch_size"]: p for p in search["probes"]}
    for probe in probes.values():
        assert probe["fits"] == (probe["status"] == "ok" and probe["peak_memory_gib"] <= budget)
        assert probe["verdict"].startswith("fits" if probe["fits"] else "does not fit (peak")
    assert any(not p["fits"] for p in probes.values()), "the budget should have stopped the search"
    best = search["largest_fitting"]  # None when even one sequence needs more (a busy machine's RSS)
    assert all(p["fits"] == (best is not None and size <= best) for size, p in probes.items())
    if best is not None and best < 32:
        assert not probes[[c for c in search["candidates"] if c > best][0]]["fits"]
    if best is not None and best > 16:  # a micro-batch above the recipe's is measured like any variant
        assert any(v["overrides"].get("micro_batch_size") == best for v in result["variants"])
    assert isinstance(result["leaves_speed_on_the_table"], bool) and result["advice"]
    assert not list(out.rglob("model.safetensors")), "checkpoints of the short runs should be deleted"


# ---------------------------------------------------------------------- report: a synthetic run
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def write_synthetic_run(run_dir, price=2.0, phases=True, extras=True):
    """A 100-step run: loss falls 8 -> ~4, 10 tokens/s ... written the way train.py writes it."""
    run_dir.mkdir(parents=True)
    records = []
    for step in range(10, 101, 10):
        records.append(
            {
                "kind": "train",
                "step": step,
                "tokens": step * 4096,
                "loss": 8 - 4 * (1 - 0.97**step),
                "lr": 1e-3 * min(1, step / 20),
                "grad_norm": 1.0,
                "tokens_per_s": 5000.0 + step,
                "elapsed": step * 0.8,
                "data_wait_share": 0.01,
            }
        )
        if step % 50 == 0:
            records.append(
                {"kind": "eval", "step": step, "tokens": step * 4096, "val_loss": 8.2 - 4 * (1 - 0.97**step)}
            )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    train_cfg = {"price_per_hour": price, "milestone_interval": 50, "global_batch_tokens": 4096}
    if phases:
        train_cfg["phases"] = {"warmup": 30, "rest": 100}
    (run_dir / "resolved_recipe.yaml").write_text(yaml.safe_dump({"name": "synthetic", "train": train_cfg}))
    if extras:
        samples = [
            {
                "step": step,
                "tokens": step * 4096,
                "prompt": prompt,
                "completion": f"step {step} | line one\n\n\nline two" if i == 0 else "\n\n",
            }
            for step in (20, 50, 100)
            for i, prompt in enumerate(PROMPTS)
        ]
        (run_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        # the records hf_pretrain.evaluation.harness.evaluate_checkpoint appends
        scores = [
            {
                "step": step,
                "tokens": step * 4096,
                "limit": 50,
                "num_fewshot": 0,
                "tasks": {
                    "hellaswag": {"acc": 0.25 + step / 1000, "acc_stderr": 0.01},
                    "arc_easy": {"acc": 0.3, "acc_stderr": 0.02},
                },
            }
            for step in (50, 100)
        ]
        (run_dir / "benchmarks.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
        train = [r for r in records if r["kind"] == "train"]
        rows = [phase_row(train, phase, price).to_dict() for phase in (Phase("warmup", 0, 30), Phase("rest", 30, 100))]
        (run_dir / "phases.json").write_text(json.dumps(rows))
    return records


def test_report_writes_the_plots_and_the_page(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir)
    assert report.main([str(run_dir)]) == 0
    out = run_dir / "report"
    for name in ("loss_vs_tokens.png", "loss_vs_dollars.png", "throughput_lr.png", "cost_per_loss_point.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name
    page = (out / "report.md").read_text()
    for name in ("loss_vs_tokens.png", "loss_vs_dollars.png", "throughput_lr.png", "cost_per_loss_point.png"):
        assert f"]({name})" in page
    assert "| phase | steps |" in page and "| warmup | 0-30 |" in page and "| rest | 30-100 |" in page
    # samples: rows are the milestone steps (multiples of 50), columns the prompts, pipes escaped
    assert f"| step | tokens | `{PROMPTS[0]}` | `{PROMPTS[1]}` |" in page
    assert "| 50 | 205K | step 50 \\| line one<br>line two | *(blank)* |" in page
    assert "| 20 |" not in page
    assert "| step | hellaswag acc | arc_easy acc |" in page and "| 100 | 0.35 | 0.3 |" in page
    assert "$0.04 at $2.00/h" in page  # 80 s at $2/h


def test_report_without_optional_files_uses_the_recipe_phases(tmp_path):
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, price=0.0, extras=False)
    page = report.write_report(run_dir, tmp_path / "out")
    assert not (tmp_path / "out" / "loss_vs_dollars.png").exists()
    assert "the run has no price" in page.read_text()
    text = page.read_text()
    assert "| warmup | 0-30 |" in text and "No samples yet" in text and "No benchmark scores" in text


def test_report_price_override_reprices_the_phases(tmp_path):
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, price=2.0)
    run = report.load_run(run_dir, price_override=4.0)
    saved = {row["name"]: row for row in json.loads((run_dir / "phases.json").read_text())}
    for row in run.phases:
        assert row.cost == pytest.approx(2 * saved[row.name]["cost"])
    assert report.load_run(run_dir).phases[0].cost == pytest.approx(saved["warmup"]["cost"])


def test_report_of_an_empty_run_says_why(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert report.main([str(tmp_path / "run")]) == EXIT_CONFIG
    assert "no training records" in capsys.readouterr().err


def test_the_plans_price_says_where_it_comes_from(capsys):
    """`plan --recipe 1b` ended with an unlabelled "$1.79/h per GPU", the recipe's A100 price, while the README
    prices the H100 (issue 45)."""
    from hf_pretrain.economics.planning import plan_command

    assert plan_command.main(["--recipe", "1b"]) == 0
    assert (
        "$1.79/h per GPU (the recipe's price_per_hour; --gpu NAME prices a GPU of the table)" in capsys.readouterr().out
    )
    assert plan_command.main(["--recipe", "1b", "--gpu", "H100"]) == 0
    assert "$2.99/h per GPU (the H100 SXM's typical price)" in capsys.readouterr().out
