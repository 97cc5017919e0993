"""`plan --gpu all` over SkyPilot's price catalog: the reader (each cloud's column order, missing spot, the 0.00
placeholder, unknown cards, unreadable files), spot's arithmetic (each term on and off), the ranking, the task it
writes (never over a file), and the shipped task held equal to what the plan writes from the snapshot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from hf_pretrain.economics.egress import store_place
from hf_pretrain.economics.planning.gpu_ranking import GpuRow
from hf_pretrain.economics.planning.offers import PricedRun, SpotAssumptions, rank_offers, task_candidates
from hf_pretrain.economics.skypilot_catalog import CatalogError, catalog_folder, read_catalog, read_cloud
from hf_pretrain.economics.spot import PreemptionCost, expected_run, preemption_rate
from hf_pretrain.engines.skypilot_task import SHIPPED_TASK, Candidate, TaskExists, task_text, write_task
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.machine.gpus import skypilot_gpu
from tests.helpers import cli, offline_env
from tests.skypilot_plan import SNAPSHOT, shipped_task_from_snapshot

GPU_INFO = "\"{'Gpus': [{'Name': 'H100', 'Count': 1}]}\""
# three clouds' own column orders, as SkyPilot's catalog writes them (aws: spot and zone; lambda: spot last, no
# zone; primeintellect: the accelerator after the machine's size, a zone, spot last)
AWS = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch\n"
    f"p5.4xlarge,H100,1.0,16.0,256.0,{GPU_INFO},6.88,2.50,us-east-1,use1-az1,x86_64\n"
    f"p5.4xlarge,H100,1.0,16.0,256.0,{GPU_INFO},6.88,2.10,us-east-1,use1-az2,x86_64\n"
    f"p4d.24xlarge,A100,8.0,96.0,1152.0,{GPU_INFO},32.77,,us-east-1,use1-az1,x86_64\n"
    f"m5.large,,,2.0,8.0,,0.096,0.03,us-east-1,use1-az1,x86_64\n"
)
LAMBDA = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice\r\n"
    f"gpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.49,us-east-1,{GPU_INFO},\r\n"
    f"gpu_1x_b200,B200,1.0,26.0,200.0,4.99,us-east-1,{GPU_INFO},\r\n"
)
PRIME = (
    "InstanceType,UpstreamCloudId,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,"
    "Price,SpotPrice\n"
    f"x__1xH100,up,16,200,H100,1,{GPU_INFO},FI,fi-1,1.90,0.75\n"
    f"x__1xL40S,up,16,200,L40S,1,{GPU_INFO},FI,fi-1,nan,0.00\n"
)


def write_catalog(folder: Path, **clouds: str) -> Path:
    for cloud, text in clouds.items():
        (folder / "v8" / cloud).mkdir(parents=True, exist_ok=True)
        (folder / "v8" / cloud / "vms.csv").write_bytes(text.encode())
    return folder


def test_each_clouds_column_order_reads_as_the_same_offers(tmp_path):
    catalog = read_catalog(catalog_folder(write_catalog(tmp_path, aws=AWS, **{"lambda": LAMBDA}, primeintellect=PRIME)))
    found = {(o.cloud, o.accelerator, o.gpus, o.spot, o.price_per_hour, o.card) for o in catalog.offers}
    assert found == {
        ("aws", "H100", 1, False, 6.88, "H100 SXM"),
        ("aws", "H100", 1, True, 2.10, "H100 SXM"),  # the cheaper zone of the region
        ("aws", "A100", 8, False, 32.77, "A100 40GB"),  # SkyPilot's `A100` is the 40 GB card; no spot price: none
        ("lambda", "H100", 1, False, 2.49, "H100 PCIe"),  # its instance type says pcie
        ("lambda", "B200", 1, False, 4.99, "B200"),  # a card the table does not know: kept, named as it is
        ("primeintellect", "H100", 1, False, 1.90, "H100 SXM"),
        ("primeintellect", "H100", 1, True, 0.75, "H100 SXM"),
        # the L40S row: a `nan` price and a 0.00 spot placeholder are no offers
    }
    assert [f.cloud for f in catalog.files] == ["aws", "lambda", "primeintellect"]
    assert "aws, lambda, primeintellect" in catalog.describe() and "0 days ago" in catalog.describe()


def test_a_cloud_without_a_spot_column_has_no_spot_offers(tmp_path):
    text = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region\nx,H100,1,2.0,r\n"
    offers = read_cloud(write_catalog(tmp_path, nospot=text) / "v8" / "nospot" / "vms.csv")
    assert [(o.spot, o.price_per_hour) for o in offers] == [(False, 2.0)]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"Name,Cost\nH100,2\n", "no column InstanceType"),  # another schema
        (b"\xff\xfe\x00garbage", "cannot read"),  # not text
    ],
)
def test_a_catalog_of_another_schema_or_unreadable_is_one_line(tmp_path, content, message):
    (tmp_path / "v8" / "aws").mkdir(parents=True)
    (tmp_path / "v8" / "aws" / "vms.csv").write_bytes(content)
    with pytest.raises(CatalogError, match=message):
        read_catalog(catalog_folder(tmp_path))


def test_a_folder_without_a_catalog_is_named(tmp_path):
    with pytest.raises(CatalogError, match="holds no <cloud>/vms.csv"):
        catalog_folder(tmp_path)
    with pytest.raises(CatalogError, match="no catalog folder"):
        catalog_folder(tmp_path / "absent")


def test_the_catalog_spellings_find_the_table_cards():
    assert skypilot_gpu("A100-80GB").name == "A100 80GB SXM"
    assert skypilot_gpu("RTX6000Ada").name == skypilot_gpu("RTX-6000-Ada").name == "RTX 6000 Ada"
    assert skypilot_gpu("h100-sxm").name == "H100 SXM"
    assert skypilot_gpu("GH200") is None


NO_PREEMPTION = PreemptionCost(relaunch_s=0, lost_work_s=0, egress_usd=0)


def test_spot_arithmetic_each_term_on_and_off():
    on_demand = expected_run(10, 2.0, 0.0, PreemptionCost(600, 1800, 5.0))
    assert (on_demand.hours, on_demand.usd, on_demand.preemptions) == (10, 20.0, 0)  # no rate: nothing added
    assert expected_run(10, 2.0, 0.5, NO_PREEMPTION).usd == 20.0  # preemptions that cost nothing cost nothing
    relaunch = expected_run(10, 2.0, 0.5, PreemptionCost(720, 0, 0))  # 0.2 h each, 0.5 an hour: 10% of the hours
    assert relaunch.hours == pytest.approx(10 / 0.9) and relaunch.usd == pytest.approx(2 * 10 / 0.9)
    lost = expected_run(10, 2.0, 0.5, PreemptionCost(0, 720, 0))  # lost work is the same arithmetic
    assert lost.hours == pytest.approx(relaunch.hours)
    egress = expected_run(10, 2.0, 0.5, PreemptionCost(0, 0, 3.0))  # 5 preemptions x $3
    assert egress.preemptions == pytest.approx(5) and egress.usd == pytest.approx(20 + 15)
    never = expected_run(10, 2.0, 2.0, PreemptionCost(1800, 0, 0))  # every machine taken back before its first step
    assert not never.finishes and math.isinf(never.usd)


def test_the_preemption_rate_is_the_clouds_estimate_unless_given():
    assert preemption_rate("primeintellect").per_hour > preemption_rate("aws").per_hour
    assert "estimate" in preemption_rate("some-new-cloud").source  # a cloud spot.yaml lacks: the default, said so
    assert preemption_rate("aws", 0.3).per_hour == 0.3


def test_the_store_charges_egress_outside_its_cloud_and_region():
    place = store_place("aws_s3:us-east-1")
    assert place.egress_usd(10, "aws", "us-east-1") == 0
    assert place.egress_usd(10, "aws", "eu-west-1") == pytest.approx(0.9)
    assert place.egress_usd(10, "nebius", "us-east-1") == pytest.approx(0.9)
    assert store_place("cloudflare_r2").egress_usd(10, "aws", "x") == 0
    assert store_place("aws_s3").egress_usd(10, "aws", "us-east-1") == pytest.approx(0.9)  # region unknown: charged
    with pytest.raises(ValueError, match="no store 's4'"):
        store_place("s4")


def card_row(name: str, rate: float, fits: bool = True) -> GpuRow:
    return GpuRow(name, fits, 8, 0, rate if fits else None, 1.0, None, None, None, "fits" if fits else "too small")


def spot_terms(**changes) -> SpotAssumptions:
    terms = dict(
        relaunch_s=600,
        relaunch_source="test",
        save_interval_steps=100,
        checkpoint_gb=10,
        store=store_place("aws_s3:us-east-1"),
        preemptions_per_hour=0.5,
    )
    return SpotAssumptions(**(terms | changes))


def test_offers_rank_by_the_runs_expected_dollars_not_the_hour(tmp_path):
    text = (
        "InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region\n"
        "a,H100,1,2.00,0.90,us-east-1\n"  # fast: the cheapest run although not the cheapest hour
        "b,L40S,1,0.60,,us-east-1\n"  # cheaper by the hour, a third of the speed
        "c,A10G,1,0.30,,us-east-1\n"  # the recipe does not fit
        "d,H100,8,16.0,,us-east-1\n"  # eight GPUs a machine: not what the task trains on
        "e,V100,1,0.10,,us-east-1\n"  # unknown to the table
    )
    catalog = read_catalog(catalog_folder(write_catalog(tmp_path, aws=text)))
    cards = {
        "H100 SXM": card_row("H100 SXM", 30_000),
        "L40S": card_row("L40S", 10_000),
        "A10G": card_row("A10G", 0, False),
    }
    ranked = rank_offers(
        catalog.offers, cards, PricedRun(1e9, 1.0, 1000, 4e9, 1_000_000, spot_terms(preemptions_per_hour=0))
    )
    assert [(r.card, r.market) for r in ranked.rows] == [
        ("H100 SXM", "spot"),
        ("L40S", "on-demand"),
        ("H100 SXM", "on-demand"),
    ]
    assert ranked.unfit == {"A10G": "too small"} and ranked.unknown == {"V100": 1} and ranked.machines_of_more_gpus == 1
    # spot's preemptions priced in turn the order: at 2 an hour, relaunches of 20 min and an interval lost each
    stormy = rank_offers(
        catalog.offers, cards, PricedRun(1e9, 1.0, 1000, 4e9, 1_000_000, spot_terms(preemptions_per_hour=2.0))
    )
    assert [(r.card, r.market) for r in stormy.rows][0] == ("L40S", "on-demand")
    spot = next(r for r in stormy.rows if r.spot)
    assert not math.isfinite(spot.usd)  # 20 min relaunches and half an interval, twice an hour: it never finishes
    assert [c.market for c in task_candidates(ranked.rows, 2)] == ["spot", "on-demand"]


def test_the_written_task_keeps_the_shipped_blocks_and_orders_the_candidates():
    base = SHIPPED_TASK.read_text()
    candidates = [Candidate("nebius", "H100", 1, True, 1.25, "first"), Candidate("lambda", "A100-80GB", 1, False, 1.79)]
    task = yaml.safe_load(task_text(base, candidates))
    shipped = yaml.safe_load(base)
    for key in ("setup", "run", "secrets", "workdir"):
        assert task[key] == shipped[key], key  # one source: the shipped task's
    assert task["envs"] | {"PLANNED_PRICES": None} == shipped["envs"] | {"PLANNED_PRICES": None}
    assert task["envs"]["PLANNED_PRICES"] == "nebius:H100:spot=1.25 lambda:A100-80GB:on-demand=1.79"
    assert task["resources"]["ordered"] == [
        {"cloud": "nebius", "accelerators": "H100:1", "use_spot": True},
        {"cloud": "lambda", "accelerators": "A100-80GB:1", "use_spot": False},
    ]
    assert task["resources"]["job_recovery"] == shipped["resources"]["job_recovery"]
    assert "accelerators" not in task["resources"] and "any_of" not in task["resources"]


def test_a_task_file_is_never_written_over(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text("mine\n")
    with pytest.raises(TaskExists, match=f"rm {path}"):
        write_task(path, "theirs\n")
    assert path.read_text() == "mine\n"


needs_snapshot = pytest.mark.skipif(not SNAPSHOT.is_dir(), reason="the catalog snapshot lives in ../shared")


@needs_snapshot
def test_the_shipped_task_rents_what_the_plan_ranks_cheapest():
    """Regenerate with `.venv/bin/python -m tests.regenerate_skypilot_task` after a change of the model or prices."""
    assert SHIPPED_TASK.read_text() == shipped_task_from_snapshot()


@needs_snapshot
def test_plan_ranks_the_snapshots_offers_and_writes_a_task_once(tmp_path):
    env = offline_env() | {"HOME": str(tmp_path)}  # no ~/.sky of the machine's
    task = tmp_path / "my-1b.yaml"
    args = ("plan", "--recipe", "1b", "--gpu", "all", "--catalog", str(SNAPSHOT), "--skypilot_task", str(task))
    done = cli(*args, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "cheapest: H100 SXM spot on verda in FIN-02" in out
    table = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == 20 and {row[0].strip("| ") for row in table} >= {"verda", "vast", "nebius", "primeintellect"}
    assert {row[3] for row in table} == {"spot", "on-demand"}
    assert "V100 (" in out and "B200 (" in out  # unknown cards said, not dropped
    assert "yours may be less): aws_s3 $1.12" in out  # the move priced under the ranked table, list prices said
    written = yaml.safe_load(task.read_text())
    assert written["resources"]["ordered"] == yaml.safe_load(SHIPPED_TASK.read_text())["resources"]["ordered"]
    again = cli(*args, env=env)
    assert again.returncode == EXIT_CONFIG and f"rm {task}" in again.stderr and len(again.stderr.splitlines()) == 1
    nowhere = tmp_path / "no" / "such" / "folder.yaml"
    missing = cli(*args[:-1], str(nowhere), env=env)
    assert missing.returncode == EXIT_CONFIG and f"fix: mkdir -p {nowhere.parent}" in missing.stderr
    assert len(missing.stderr.splitlines()) == 1


def test_plan_without_a_catalog_prices_the_typical_table_and_one_that_cannot_be_read_says_so(tmp_path):
    env = offline_env() | {"HOME": str(tmp_path)}
    plain = cli("plan", "--recipe", "smoke", "--gpu", "all", env=env)
    assert plain.returncode == 0, plain.stderr
    assert "prices: typical on-demand prices of the GPU table" in plain.stdout
    (tmp_path / "bad" / "aws").mkdir(parents=True)
    (tmp_path / "bad" / "aws" / "vms.csv").write_text("Name,Cost\n")
    bad = cli("plan", "--recipe", "smoke", "--gpu", "all", "--catalog", str(tmp_path / "bad"), env=env)
    assert bad.returncode == 0 and "no column InstanceType" in bad.stdout and "| H100 SXM |" in bad.stdout
    wrong = cli("plan", "--recipe", "smoke", "--gpu", "H100", "--catalog", str(tmp_path), env=env)
    assert wrong.returncode == EXIT_CONFIG and "add --gpu all" in wrong.stderr
    no_task = cli("plan", "--recipe", "smoke", "--gpu", "all", "--skypilot_task", str(tmp_path / "t.yaml"), env=env)
    assert no_task.returncode == EXIT_CONFIG and "SkyPilot's catalog" in no_task.stderr
    assert not (tmp_path / "t.yaml").exists()


def test_a_runs_own_relaunches_price_its_spot_offers(tmp_path):
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.economics.egress import move_cost
    from hf_pretrain.economics.planning.plan import spot_assumptions
    from hf_pretrain.economics.planning.request import PlanRequest
    from hf_pretrain.economics.spot import BEFORE_THE_PROCESS_S
    from hf_pretrain.run_folder.sessions import append

    run = tmp_path / "run"
    run.mkdir()
    for n, seconds in enumerate((500.0, 40.0, 60.0, 80.0)):  # the first session's start is no relaunch
        append(run, {"kind": "start", "session": f"s{n}"})
        append(run, {"kind": "first_step", "session": f"s{n}", "step": 1, "to_first_step_s": seconds})
    recipe, _ = parse_recipe_args(["--recipe", "smoke", "--output_dir", str(run)], prog="plan", description="")
    move = move_cost(10**9, 1e9, 32000)
    terms = spot_assumptions(PlanRequest(recipe=recipe, gpu="all"), move)
    assert terms.relaunch_s == pytest.approx(BEFORE_THE_PROCESS_S + 60.0) and "run's own" in terms.relaunch_source
    empty, _ = parse_recipe_args(["--recipe", "smoke", "--output_dir", str(tmp_path / "new")], prog="p", description="")
    assert "an estimate" in spot_assumptions(PlanRequest(recipe=empty, gpu="all"), move).relaunch_source


def test_a_prices_file_with_nan_is_refused_not_priced_nan(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: .nan\n")
    done = cli(
        "plan",
        "--recipe",
        "smoke",
        "--gpu",
        "all",
        "--prices",
        str(prices),
        env=offline_env() | {"HOME": str(tmp_path)},
    )
    assert done.returncode == EXIT_CONFIG and "got nan" in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_relaunch_estimate_is_the_middle_of_the_engines_pages_stages():
    """One figure stated twice: the stages of docs/engines.md's relaunch table, each at the middle of its range,
    are what plan prices a spot relaunch at (economics/spot.py), and the page's total holds the 1b's estimate."""
    import re

    from hf_pretrain.economics.spot import RELAUNCH_STAGES_S, relaunch_estimate_s

    page = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()
    rows = re.findall(r"^\| (.+?) \| \**~?(\d+)(?:-(\d+))? min", page, flags=re.M)
    middles = {stage: (int(low) + int(high or low)) / 2 * 60 for stage, low, high in rows}
    stages = list(middles.values())
    assert stages[:4] == [RELAUNCH_STAGES_S[s] for s in ("notice", "provision", "install", "pod check")], middles
    low, high = (int(n) for n in re.search(r"\*\*~(\d+)-(\d+) min\*\*", page).groups())
    assert low * 60 <= relaunch_estimate_s(12.5) <= high * 60
