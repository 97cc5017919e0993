"""`hf-pretrain check` (issue 41): a pod's worth in five minutes, before any data moves in. On the CPU the
whole check runs end to end with the smoke recipe: every part says a figure or a one-line reason on the
screen, an overrun part is cut and said so, the store gets CPU records that `plan` never prices a GPU by."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf_pretrain.check.deadline import run_part
from hf_pretrain.check.figures import Figure, Report, read_figures
from hf_pretrain.check.store_rates import measure as measure_object_store
from hf_pretrain.check.verdict import measured_device, plan_best, verdict
from hf_pretrain.check.volume_speed import measure as measure_disk
from hf_pretrain.config import load_recipe
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_PREEMPTED
from hf_pretrain.machine.run_profile import THE_CPU, run_profile
from hf_pretrain.machine.what_if import measured_card, profile_on
from tests.helpers import OUTSIDE_CHECKOUT, ROOT, card_sections, cli, h100_configuration, offline_env

PART_TITLES = (
    "(a) matmul",
    "(b) SDPA",
    "(c) the recipe's step",
    "(d) largest",
    "(e) output_dir",
    "(f) object",
    "(g) all-reduce",
)


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu_and_leaves_cpu_records_plan_never_prices_a_gpu_by(tmp_path):
    home = tmp_path / "home"
    env = offline_env() | {"HF_PRETRAIN_HOME": str(home)}
    args = ["check", "--recipe", "smoke", "--budget_s", "240"]
    args += ["--output", str(tmp_path / "check"), "--output_dir", str(tmp_path / "run")]
    # a step of one micro-batch, two timed after one: the parts end as soon as they are done, the budget
    # only bounds them (a loaded CI machine stretches them, not the test)
    args += ["--steps", "2", "--warmup", "1", "--global_batch_tokens", "2048", "--micro_batch_size", "16"]
    done = cli(*args, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for title in PART_TITLES:  # each part's title, then at least one line of its own: a figure or why not
        at = next(i for i, line in enumerate(lines) if line.startswith(title))
        assert lines[at + 1].startswith("  "), lines[at : at + 2]
    out = done.stdout
    assert "GFLOP/s" in out and "torch picks" in out  # the CPU's matmul and SDPA figures
    assert "recipe as written:" in out and "tokens/s" in out
    assert "largest micro-batch: skipped: no GPU" in out
    assert "write:" in out and "read:" in out and "object store: skipped: data_dir and output_dir are local" in out
    assert "all-reduce: skipped: no GPU" in out
    assert "measured on a CPU: it prices no GPU" in out and "plan's best for smoke" in out
    assert not list((tmp_path / "run").glob(".hf_pretrain_check*"))  # the disk part's scratch file is gone
    # every figure in the tmp store, labelled with the card (cpu), versions and date
    store = home / "measurements.jsonl"
    records = [json.loads(line) for line in store.read_text().splitlines()]
    assert records and all(r["kind"] == "check" and r["gpu"] == "cpu" and r["date"] and r["torch"] for r in records)
    assert {"matmul", "attention", "step", "disk"} <= {r["part"] for r in records}
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    assert result["verdict"] and result["parts"]["step"] == ["done"]
    # plan, reading this store, prices every GPU without them (no "measured" row), and no measurement reads them
    probe = (
        "from hf_pretrain.config import load_recipe\n"
        "from hf_pretrain.economics.planning.gpu_ranking import gpu_prices, ranked_rows\n"
        "from hf_pretrain.economics.measurements import _stored, store_path\n"
        "r = load_recipe('smoke')\n"
        "rows = ranked_rows(1e9, gpu_prices(None), model=r.model, data=r.data, train=r.train, written=r.step_as_written)\n"
        "print(sum(1 for r in rows if r.measured), len(_stored(store_path(), False)))\n"
    )
    asked = subprocess.run([sys.executable, "-c", probe], env=env, cwd=OUTSIDE_CHECKOUT, capture_output=True, text=True)
    assert asked.stdout.split() == ["0", "0"], asked.stderr[-2000:]


def test_a_part_that_overruns_its_limit_is_cut_and_said_so_and_keeps_what_it_wrote(tmp_path):
    results = tmp_path / "figures.jsonl"
    Report("matmul", results, None, say=lambda _: None).figure("early", 1.0, "x", "early: 1 x")
    said: list[str] = []
    context = {"recipe": "smoke", "results": str(results), "folder": str(tmp_path), "limit_s": 0.5}
    assert run_part("matmul", context, tmp_path / "contexts", 0.5, say=said.append) == "cut"
    assert said == ["  matmul: cut at its limit of 0 s; what it measured before is kept"]
    assert [f.name for f in read_figures(results)] == ["early"]


def test_the_disk_part_writes_reads_and_removes_its_own_file(tmp_path):
    said: list[str] = []
    report = Report("disk", tmp_path / "figures.jsonl", None, say=said.append)
    measure_disk(tmp_path / "not" / "yet", 8 * 2**20, report, limit_s=20)
    figures = {f.name: f for f in read_figures(tmp_path / "figures.jsonl")}
    assert figures["write"].value > 0 and figures["read"].value > 0
    assert figures["write"].detail["bytes"] == 8 * 2**20 and figures["write"].detail["folder"] == str(tmp_path)
    assert "checkpoint takes" in said[0] and list(tmp_path.iterdir()) == [tmp_path / "figures.jsonl"]


def test_object_store_urls_are_measured_where_fsspec_has_them_and_said_not_installed_where_not(tmp_path, monkeypatch):
    import fsspec

    from hf_pretrain.store.schemes import SCHEMES, Scheme

    # fsspec's in-memory store stands in for a bucket (store/schemes.py has a row for s3, gs and hf)
    monkeypatch.setitem(SCHEMES, "memory", Scheme("memory", module="fsspec", extra=None))
    fsspec.filesystem("memory").pipe_file("memory://bucket/data/shard.ds", b"x" * 4096)
    said: list[str] = []
    report = Report("object_store", tmp_path / "figures.jsonl", None, say=said.append)
    from hf_pretrain.store.location import Location, Where

    def placed(data: str, run: str) -> Where:  # as the check's door places them
        return Where(Location.of(run), Location.of(data, kind="data"))

    measure_object_store(placed("memory://bucket/data", "memory://bucket/run"), report)
    measure_object_store(placed("data/smoke", "gs://bucket/run"), report)  # gcsfs is not installed here
    figures = {f.name: f for f in read_figures(tmp_path / "figures.jsonl")}
    assert figures["download"].value > 0 and figures["upload"].value > 0
    assert not fsspec.filesystem("memory").find("memory://bucket/run")  # the scratch object is gone
    assert figures["output_dir"].value is None
    assert "output_dir: skipped: object store support not installed (gs:// needs the gcsfs package" in said[-1]


def step(device: str, tokens_per_s: float, name: str = "recipe as written") -> Figure:
    return Figure("step", name, tokens_per_s, "tokens/s", f"{name}: {tokens_per_s}", device, {"overrides": {}})


def verdict_of(recipe, figures: list[Figure]) -> list[str]:
    """The verdict `check` says of `figures` for `recipe`: what command.conclude hands it, without the records."""
    device = measured_device(figures)
    return verdict(
        figures,
        recipe.model,
        recipe.data,
        step=profile_on(recipe.step_as_written, measured_card(device)).step if device else None,
        global_batch_tokens=recipe.train.global_batch_tokens,
        plan=plan_best(**card_sections(recipe)),
        price_per_hour=recipe.reporting.price_per_hour,
        recipe_name=recipe.name,
    )


def test_the_verdict_prices_the_pod_ranks_it_in_plan_and_names_a_slow_node(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path))
    recipe = load_recipe("1b")
    h100 = "NVIDIA H100 80GB HBM3"
    healthy = verdict_of(recipe, [step(h100, 78_000)])
    assert healthy[0].startswith("recipe as written: 78,000 tokens/s, MFU 55.")  # 7.04 GFLOP a token, 989 TFLOP/s
    assert healthy[1].startswith("$") and "per billion tokens on this NVIDIA H100 80GB HBM3" in healthy[1]
    assert healthy[2].startswith("ranks ") and "plan's best" in healthy[2]
    assert healthy[-1] == "no sign of a slow or faulty node"
    # 40% under the project's own H100 record of this configuration (measured.jsonl) and the model
    slow = verdict_of(recipe, [step(h100, 46_000), Figure("matmul", "bfloat16", 500.0, "TFLOP/s", "", h100)])
    said = " ".join(slow)
    assert "likely a slow or faulty node" in said and "project's H100 run" in said
    assert "bf16 matmul 500 TFLOP/s" in said  # under the published matmul rate of an H100 SXM
    cpu = verdict_of(load_recipe("smoke"), [step(None, 5_000)])
    assert cpu[0] == "recipe as written: 5,000 tokens/s" and cpu[1].startswith("measured on a CPU: it prices no GPU")


def test_a_budget_too_small_to_measure_anything_is_refused_up_front_naming_the_budget_that_can(
    tmp_path, monkeypatch, capsys
):
    """Was accepted: every part skipped, exit 1 (issue 45)."""
    from hf_pretrain.check import main

    monkeypatch.chdir(tmp_path)
    assert main(["--recipe", "smoke", "--budget_s", "1", "--parts", "matmul,step"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "too small to measure anything" in err
    assert "give at least --budget_s 12" in err  # matmul's share of matmul+step: 0.05 / 0.30 of 12 s is 2 s
    assert not (tmp_path / "runs").exists()  # refused before any work


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0"])
def test_a_budget_that_is_not_a_positive_finite_number_is_refused_in_one_line(value, tmp_path, monkeypatch, capsys):
    """`--budget_s nan` was accepted, then a ZeroDivisionError traceback and exit 0 (issue 45)."""
    from hf_pretrain.check import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["--recipe", "smoke", "--budget_s", value])
    err = capsys.readouterr().err
    assert (
        exited.value.code == EXIT_CONFIG and len(err.strip().splitlines()) == 1 and f"budget_s={value} must be " in err
    )
    assert "e.g. --budget_s 300" in err and not (tmp_path / "runs").exists()


def test_check_output_never_replaces_a_users_files_and_replaces_an_earlier_checks_only_when_asked(
    tmp_path, monkeypatch, capsys
):
    """`--output` holding the user's own check.json was overwritten without a word; a second check into
    the same folder kept the first's part markers, which could call a cut part done (issue 45)."""
    from hf_pretrain.check import command

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "check.json").write_text("my own notes")
    assert command.main(["--recipe", "smoke", "--output", str(mine), "--overwrite"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "holds files the check did not write" in err and "check.json" in err and len(err.splitlines()) == 1
    assert (mine / "check.json").read_text() == "my own notes"
    # an earlier check's folder (its record, its files unchanged): refused without --overwrite, then
    # --overwrite removes its files, markers included, before the new check writes
    monkeypatch.setattr(command, "run_parts", lambda request, recipe_file, results, statuses, say: None)
    monkeypatch.setattr(command, "conclude", lambda recipe, figures, say: [])
    earlier = tmp_path / "earlier"
    request = command.CheckRequest(recipe=load_recipe("smoke"), output=earlier)
    (earlier / "contexts").mkdir(parents=True)
    (earlier / "contexts" / "step.0.done").touch()
    command.run_check(request, say=lambda _: None)
    assert command.main(["--recipe", "smoke", "--output", str(earlier)]) == EXIT_CONFIG
    assert "an earlier check's results; pass --overwrite" in capsys.readouterr().err
    command.check_output(earlier, overwrite=True)
    command.remove_earlier_check(earlier)
    assert not earlier.exists() or not any(earlier.rglob("*"))
    (earlier / "check.json").parent.mkdir(parents=True, exist_ok=True)
    (earlier / "check.json").write_text("edited since")  # no longer what the check wrote: the user's now
    with pytest.raises(ValueError, match="did not write or that changed since"):
        command.check_output(earlier, overwrite=True)


def test_ctrl_c_during_a_part_kills_its_process_group_before_passing_the_interrupt_on(tmp_path, monkeypatch):
    """The step worker, in its own session, was orphaned for about 50 s after a Ctrl-C (issue 45). The
    interrupt is raised by the wait itself, after the child is started: no race with the child."""
    import os
    import subprocess

    from hf_pretrain.check import deadline

    started: list[subprocess.Popen] = []

    class InterruptedWait(subprocess.Popen):
        def __init__(self, command, **kwargs):
            super().__init__([sys.executable, "-c", "import time; time.sleep(600)"], **kwargs)
            started.append(self)

        def wait(self, timeout=None):
            if timeout is not None:  # the part's wait: Ctrl-C arrives now
                raise KeyboardInterrupt
            return super().wait()

    monkeypatch.setattr(deadline.subprocess, "Popen", InterruptedWait)
    with pytest.raises(KeyboardInterrupt):
        run_part("step", {"item_index": 0}, tmp_path, 60, say=lambda _: None)
    assert started[0].returncode == -9
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0].pid, 0)  # nothing of its session is left


def test_ctrl_c_writes_check_json_with_what_was_measured_and_exits_130(tmp_path, monkeypatch, capsys):
    """Was a KeyboardInterrupt traceback, exit 1 and no check.json (issue 45)."""
    from hf_pretrain.check import command

    def interrupted(request, recipe_file, results, statuses, say):
        Report("matmul", results, None, say=say).figure("float32", 12.0, "GFLOP/s", "float32: 12 GFLOP/s")
        statuses["matmul"] = ["done"]
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_parts", interrupted)
    assert command.main(["--recipe", "smoke", "--output", str(tmp_path / "check")]) == 130
    out, err = capsys.readouterr()
    assert "interrupted (Ctrl-C)" in out and "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    assert result["interrupted"] and result["parts"] == {"matmul": ["done"]}
    assert [f["name"] for f in result["figures"]] == ["float32"]


def test_sigterm_during_a_part_ends_the_check_as_ctrl_c_does_with_75(tmp_path, monkeypatch, capsys):
    """Issue 57: a SIGTERM (Slurm's `--signal`, a preemption) killed the check's own process and left its part's
    process, in a session of its own, running alone. Now it ends as Ctrl-C does (the part's session killed,
    check.json written) and exits 75: a requeue checks again. The signal is sent by the part itself."""
    import os
    import signal

    from hf_pretrain.check import command

    def terminated(request, recipe_file, results, statuses, say):
        statuses["matmul"] = ["done"]
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop the part")

    monkeypatch.setattr(command, "run_parts", terminated)
    assert command.main(["--recipe", "smoke", "--output", str(tmp_path / "check")]) == EXIT_PREEMPTED
    out, err = capsys.readouterr()
    assert "interrupted (SIGTERM)" in out and "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    assert "exit 75" in err
    result = json.loads((tmp_path / "check" / "check.json").read_text())
    assert result["interrupted"] and result["stopped_by"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is not command._terminated  # handed back


def test_a_measurement_store_that_cannot_be_written_says_why(tmp_path):
    """Was "recorded nothing" without why (issue 45)."""
    from hf_pretrain.economics.check_records import StoreNotWritten, new_record, record_checks

    (tmp_path / "home").write_text("a file where the store's folder should be")
    with pytest.raises(StoreNotWritten, match=r"cannot be written \(.+\); set HF_PRETRAIN_HOME to a writable"):
        record_checks([new_record("disk", "write", 1.0, "MB/s", None)], tmp_path / "home" / "measurements.jsonl")


def test_a_step_without_a_figure_on_a_machine_without_a_gpu_names_what_helps_not_a_larger_budget():
    """`check --recipe 1b` on a laptop advised a larger --budget_s, which cannot help there (issue 45)."""
    from hf_pretrain.check import command

    said = command.what_helps(command.CheckRequest(recipe=load_recipe("1b"), output=Path("x")), on_gpu=False)
    assert "a larger --budget_s will not help" in said
    assert "`hf-pretrain check --recipe smoke`" in said and "`hf-pretrain check --recipe 1b` on the rented card" in said


def test_check_help_lists_its_own_options_before_the_recipe_keys(capsys):
    from hf_pretrain.check import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.index("check options:") < out.index("--budget_s") < out.index("model (")


def test_wrong_flags_are_refused_in_one_line(capsys):
    from hf_pretrain.check import main

    assert main(["--recipe", "smoke", "--parts", "matmul,gpu"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--parts gpu: not a part" in err and len(err.strip().splitlines()) == 1
    assert main(["--recipe", "smoke", "--variants", "attention_backend=flash3"]) == EXIT_CONFIG
    assert "attention_backend" in capsys.readouterr().err


def test_a_cpu_check_record_never_prices_a_gpu_in_plan(tmp_path, monkeypatch):
    """Even a CPU record claiming a GPU-sized rate for the very configuration plan prices: plan's rows stay
    modelled, no measurement reads it, and only check records of a GPU choose a kernel."""
    from hf_pretrain.economics.check_records import new_record, record_checks, stored_checks
    from hf_pretrain.economics.measurements import _stored, recorded_measurement, store_path
    from hf_pretrain.economics.planning.gpu_ranking import gpu_prices, ranked_rows

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path))
    recipe = load_recipe("smoke")
    record_checks([new_record("step", "recipe as written", 1e9, "tokens/s", None, overrides={})])
    assert [(r.gpu, r.device) for r in stored_checks(shipped=False)] == [("cpu", "cpu")]
    assert _stored(store_path(), False) == []
    assert all(recorded_measurement(h100_configuration(recipe), gpu) is None for gpu in ("H100 SXM", "cpu"))
    assert not [row for row in ranked_rows(1e9, gpu_prices(None), **card_sections(recipe)) if row.measured]


def test_one_command_ships_a_gpu_check_to_the_records_and_the_docs_and_refuses_a_cpu_one(tmp_path, monkeypatch):
    import dataclasses
    import importlib.util

    from hf_pretrain.config import save_recipe
    from hf_pretrain.economics import measurements

    spec = importlib.util.spec_from_file_location("ship_check", ROOT / "benchmarks" / "ship_check.py")
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gpu.md").write_text(f"# GPU\n\n{ship.BEGIN}\nnothing yet\n{ship.END}\nafter\n")
    monkeypatch.setattr(ship, "ROOT", tmp_path)
    monkeypatch.setattr(measurements, "SHIPPED_STORE", tmp_path / "measured.jsonl")
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    folder = tmp_path / "gpu_check"
    folder.mkdir()
    recipe = load_recipe("1b")
    save_recipe(recipe, folder / "recipe.yaml")
    h100 = "NVIDIA H100 80GB HBM3"
    fp8 = {"mixed_precision": "fp8", "fp8_recipe": "rowwise"}
    figures = [
        Figure("matmul", "bfloat16", 780.0, "TFLOP/s", "matmul peak: ...", h100),
        step(h100, 78_100),
        dataclasses.replace(step(h100, 90_000, "mixed_precision=fp8 fp8_recipe=rowwise"), detail={"overrides": fp8}),
        Figure("micro_batch", "largest micro-batch", None, "", "largest micro-batch: none fits", h100),
    ]
    result = {"date": "2026-11-27", "seconds": 501.0, "figures": [dataclasses.asdict(f) for f in figures]}
    (folder / "check.json").write_text(json.dumps(result | {"verdict": ["no sign of a slow or faulty node"]}))
    assert ship.main([str(folder)]) == 0
    found = measurements.recorded_measurement(h100_configuration(load_recipe("1b", fp8)), "H100 SXM")
    assert found.tokens_per_s == 90_000 and found.shipped and "project's check, 2026-11-27" in found.label()
    page = (tmp_path / "docs" / "gpu.md").read_text()
    assert (
        "nothing yet" not in page
        and page.endswith("after\n")
        and "| step | recipe as written | 78,100.00 tokens/s |" in page
    )
    assert "| micro_batch | largest micro-batch | none fits |" in page
    (folder / "check.json").write_text(
        json.dumps(result | {"figures": [dataclasses.asdict(step(None, 5.0))], "verdict": []})
    )
    assert ship.main([str(folder)]) == 2  # a CPU's check never becomes a shipped record


def test_the_sdpa_part_times_each_kernel_once_under_its_own_name_and_calls_the_fastest_fastest(tmp_path, monkeypatch):
    """It timed torch's pick twice, as "default" (80 ms) and as "flash" (132 ms), and called the slower
    fastest (issue 45). Each kernel now once, interleaved rounds keeping its best, the pick marked."""
    from hf_pretrain.check import sdpa

    times = {"flash": [0.132, 0.080], "math": [0.300, 0.290]}  # flash warms up in the second round
    asked: list[str] = []

    def timed(q, k, v, backend, min_seconds):
        asked.append(backend)
        return times[backend][asked.count(backend) - 1]

    monkeypatch.setattr(sdpa, "seconds_per_call", timed)
    monkeypatch.setattr(sdpa.torch, "_fused_sdp_choice", lambda *a, **k: sdpa.SDPBackend.FLASH_ATTENTION.value)
    said: list[str] = []
    report = Report("attention", tmp_path / "f.jsonl", None, say=said.append)
    smoke = load_recipe("smoke")
    sdpa.measure(
        smoke.model, run_profile(smoke.step_as_written, THE_CPU).step, report, 10, THE_CPU, seq_len=smoke.data.seq_len
    )
    figures = {f.name: f for f in read_figures(tmp_path / "f.jsonl")}
    assert asked == ["flash", "math", "flash", "math"] and "default" not in figures
    assert figures["flash"].value == pytest.approx(80.0) and figures["math"].value == pytest.approx(290.0)
    assert figures["fastest"].detail["backend"] == "flash" and figures["fastest"].value == pytest.approx(80.0)
    assert any(line.startswith("  flash (torch picks it): 80.00 ms") for line in said), said


def test_a_store_that_does_not_answer_is_the_checks_last_line_and_exit_71(s3_bucket, s3_server, tmp_path):
    """Issue 57: with the run's store cut off, part (f) said "failed: EndpointConnectionError", the verdict said
    nothing of it and the exit code followed the step alone. A run that cannot reach its store is refused first:
    71 (this machine's network, as far as the check can tell: an engine tries another); a store that answers no
    (no such bucket) is 78 (the same everywhere: fix the input)."""
    from hf_pretrain.exit_codes import EXIT_FAULTY_HOST

    env = offline_env() | s3_server.env | {"HF_PRETRAIN_HOME": str(tmp_path / "home"), "HF_PRETRAIN_RECORD": "0"}
    args = ["check", "--recipe", "smoke", "--parts", "object_store", "--budget_s", "120"]
    s3_server.proxy.cut()
    try:
        cut = cli(*args, "--output", str(tmp_path / "cut"), "--output_dir", f"{s3_bucket}/run",
                  "--data_dir", f"{s3_bucket}/data", env=env, timeout=300)  # fmt: skip
    finally:
        s3_server.proxy.restore()
    lines = [line for line in cut.stderr.splitlines() if line.startswith("hf-pretrain check:")]
    assert cut.returncode == EXIT_FAULTY_HOST, cut.stdout[-2000:] + cut.stderr[-2000:]
    assert cut.stderr.strip().splitlines()[-1] == lines[0], cut.stderr  # the last line
    assert len(lines) == 1 and "cannot use its store" in lines[0] and "does not answer" in lines[0], cut.stderr
    assert f"{s3_bucket}/run" in lines[0] and "rent another machine" in lines[0] and "Traceback" not in cut.stderr
    assert "the run's store fails from here" in cut.stdout  # the verdict says it too

    missing = cli(*args, "--output", str(tmp_path / "missing"), "--output_dir", "s3://no-such-bucket-57/run",
                  env=env, timeout=300)  # fmt: skip
    lines = [line for line in missing.stderr.splitlines() if line.startswith("hf-pretrain check:")]
    assert missing.returncode == EXIT_CONFIG, missing.stdout[-2000:] + missing.stderr[-2000:]
    assert len(lines) == 1 and "does not exist" in lines[0] and "(exit 78)" in lines[0], missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == lines[0] and "Traceback" not in missing.stderr
