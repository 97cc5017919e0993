"""Issue 33: every refusal a message, every status true. Bad input as a new user types it, each
answered by one line that names the problem and a fix that works when pasted, never a traceback and
never silence. CPU, offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_pretrain.economics.planning import gpu_ranking, plan_command
from hf_pretrain.economics.prices import PriceError
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.stacks import communicate_or_diagnose


# ---------------------------------------------------------------------- a price file
def test_a_price_file_naming_an_unknown_gpu_is_refused_with_the_nearest_names(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 0.50\nH1OO PCie: 0.10\n")
    with pytest.raises(PriceError, match=r"no GPU `H1OO PCie` in the GPU table; did you mean `H100 PCIe`"):
        gpu_ranking.gpu_prices(str(prices))
    # the command says it in one line, with or without --gpu (the file was once never read without it)
    for extra in ([], ["--gpu", "all"], ["--gpu", "H100"]):
        assert plan_command.main(["--recipe", "1b", "--prices", str(prices), *extra]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"hf-pretrain plan: error: {prices}: no GPU `H1OO PCie` in the GPU table; did you mean "
            "`H100 PCIe`? (every GPU: gpus.yaml)"
        ], err


# ---------------------------------------------------------------------- the doctor's disk check
def test_the_disk_check_sizes_a_checkpoint_from_its_real_bytes_and_passes_a_disk_the_run_fits(
    reference_run, smoke_data, tmp_path, monkeypatch
):
    """Issue 33: a flat 64 MB beside the tensors made the smoke model's 16 MB checkpoint 80 MB, 5x, and
    refused a disk the run fits."""
    import shutil
    from collections import namedtuple

    from hf_pretrain.checkpoints.store import list_checkpoints
    from hf_pretrain.config import load_recipe
    from hf_pretrain.model.llama import model_parameter_count, tokenizer_size_of
    from hf_pretrain.preflight import disk

    run_dir, _ = reference_run
    real = disk.newest_checkpoint_bytes(run_dir)
    assert real == sum(f.stat().st_size for f in list_checkpoints(run_dir)[0].path.rglob("*") if f.is_file())
    recipe = load_recipe("smoke", {"data_dir": str(smoke_data), "output_dir": str(tmp_path / "new")})
    estimate = disk.checkpoint_bytes(
        model_parameter_count(recipe.model, tokenizer_size_of(recipe.data)), disk.tokenizer_bytes(recipe.data)
    )
    assert real <= estimate <= 1.15 * real, (estimate, real)  # an upper bound, and a close one
    # a disk with room for the run's 3 checkpoints and its export, and little more, passes
    needs = 3 * estimate + 4 * model_parameter_count(recipe.model, tokenizer_size_of(recipe.data))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(2 * needs, needs, int(1.1 * needs)))
    result = disk.check_disk_space(
        recipe.train,
        recipe.checkpoints,
        recipe.data,
        parameters=model_parameter_count(recipe.model, tokenizer_size_of(recipe.data)),
    )
    assert result.status == "pass", result.reason


# ---------------------------------------------------------------------- eval: limits, suites, offline
EVAL_ARGUMENTS = [
    (
        ["--limit", "-5"],
        "--limit -5: give a number of documents (a whole number, 1 or more) or a fraction between 0 and 1",
    ),
    (["--limit", "0"], "--limit 0: give a number of documents"),
    (["--limit", "2.5"], "--limit 2.5: give a number of documents"),
    (["--num_fewshot", "-1"], "--num_fewshot -1: give 0 (zero-shot) or more examples per prompt"),
    (["--batch_size", "abc"], "--batch_size abc: give a whole number of 1 or more, `auto` or `auto:N`"),
    (["--tasks", "none", "--text", "missing.txt"], "--text missing.txt: no such file"),
    (["--data_dir", "no-such-dir"], "--data_dir no-such-dir: no such folder"),
    (["--tasks", "my-suite.yaml"], "--tasks my-suite.yaml: no such suite file; the shipped suites: default"),
    (
        ["--tasks", "nosuchsuite"],
        "unknown task(s) or suite: nosuchsuite; the suites: default (eval/suites), the "
        "offline tasks: arc_challenge_local, arc_easy_local",
    ),
]


@pytest.mark.parametrize(("arguments", "said"), EVAL_ARGUMENTS, ids=lambda x: x if isinstance(x, str) else None)
def test_eval_refuses_a_bad_argument_in_one_line_before_loading_anything(
    tmp_path, monkeypatch, capsys, arguments, said
):
    from hf_pretrain.evaluation import eval_command, harness

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(harness, "load_model", lambda *a: pytest.fail("a model was loaded for a refused command"))
    (tmp_path / "model").mkdir()
    assert eval_command.main(["--model", "model", *arguments]) == EXIT_CONFIG
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("hf-pretrain")]  # not torch's import warnings
    assert "Traceback" not in err and len(ours) == 1 and ours[0].startswith("hf-pretrain eval: error: "), err
    assert said in ours[0], ours


def test_eval_of_a_model_that_is_neither_a_folder_nor_a_repo_id_says_so(capsys):
    from hf_pretrain.evaluation import eval_command

    assert eval_command.main(["--model", "/no/such/export"]) == EXIT_CONFIG
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-pretrain")]
    assert err == [
        "hf-pretrain eval: error: --model /no/such/export: no such folder, and not a Hub repo id (owner/name); "
        "give an `hf-pretrain export` folder, a run folder or checkpoint, or a repo id"
    ]


def test_a_missing_extra_is_one_line_with_its_pip_command(monkeypatch):
    from types import SimpleNamespace

    from hf_pretrain import extras

    imported = []

    def import_module(name):
        imported.append(name)
        if name == "lm_eval":
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)

    monkeypatch.setattr(extras, "importlib", SimpleNamespace(import_module=import_module))
    assert extras.missing_extra("eval") == (
        f"needs the `eval` extra (lm_eval is not installed): {extras.install_line('eval')}"
    )
    assert imported == ["lm_eval"]  # the first missing module is named; the rest are not tried
    monkeypatch.setattr(extras, "importlib", SimpleNamespace(import_module=lambda name: imported.append(name)))
    assert extras.missing_extra("demo") is None and imported[-1] == "gradio"


def a_shell_without_the_venv() -> dict[str, str]:
    """A terminal in which nobody activated the venv that runs the suite: its bin is off the PATH."""
    import os
    import sys

    ours = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p.rstrip("/") != ours]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return {**env, "PATH": os.pathsep.join(path or ["/usr/bin", "/bin"])}


@pytest.mark.parametrize("where", ["the clone", "elsewhere"])
def test_the_install_line_of_an_extra_works_pasted_in_a_clone(where, tmp_path, monkeypatch):
    """Issue 57: `pip install 'hf-pretrain[s3]'` fails in a clone (no index has it), and a bare `pip` with the
    venv not activated installs into another Python. In a clone the line is the clone's own install, with
    the venv's pip, naming the clone's files as they are found from where the user stands."""
    from hf_pretrain import extras
    from tests.helpers import ROOT, pip_fix_works_here

    if extras.source_tree() != ROOT:
        pytest.skip("the suite runs from an installed wheel, not from this clone")
    env = a_shell_without_the_venv()
    monkeypatch.setenv("PATH", env["PATH"])
    cwd = ROOT if where == "the clone" else tmp_path
    line = extras.install_line("s3", cwd=cwd)
    if where == "the clone":
        assert line.endswith(" install -c constraints.txt -e '.[s3]'"), line
    else:
        assert f"-c {ROOT}/constraints.txt -e '{ROOT}[s3]'" in line, line
    pip_fix_works_here(line, cwd, env)


def test_the_install_line_of_an_extra_outside_a_clone_names_the_index(tmp_path, monkeypatch):
    """An installed wheel has no constraints.txt nor source to install from: the extra comes from the index,
    with the pip of the Python that runs hf-pretrain."""
    import sys

    from hf_pretrain import extras
    from tests.helpers import pip_fix_works_here

    monkeypatch.setattr(extras, "source_tree", lambda: None)
    env = a_shell_without_the_venv()
    monkeypatch.setenv("PATH", env["PATH"])
    line = extras.install_line("gcs", cwd=tmp_path)
    assert line == f"{Path(sys.executable).parent}/pip install 'hf-pretrain[gcs]'", line
    pip_fix_works_here(line, tmp_path, env)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + env["PATH"])  # the venv activated
    assert extras.install_line("gcs", cwd=tmp_path) == "pip install 'hf-pretrain[gcs]'"


@pytest.mark.slow
def test_eval_offline_of_a_task_whose_dataset_is_not_cached_is_one_line(exported, tmp_path):
    import subprocess
    import sys

    from tests.helpers import OUTSIDE_CHECKOUT, offline_env

    env = {**offline_env(), "HF_HOME": str(tmp_path / "empty-cache"), "HF_DATASETS_OFFLINE": "1"}
    for model in (str(exported), "someone/not-cached"):
        result = subprocess.run(
            [sys.executable, "-m", "hf_pretrain.cli", "eval", "--model", model, "--tasks", "arc_easy", "--limit", "2"],
            cwd=OUTSIDE_CHECKOUT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        if model == "someone/not-cached":
            assert last.startswith("hf-pretrain eval: error: cannot load the model someone/not-cached: "), last
        else:
            assert last.startswith(
                "hf-pretrain eval: error: a task's dataset is not in the cache and the Hub cannot be"
            )
            assert "use the offline tasks (arc_challenge_local, arc_easy_local) with --data_dir" in last
            # which files, and where a user gets them (issue 45)
            assert "ARC-Easy-test.jsonl" in last and "load_dataset('allenai/ai2_arc'" in last and "Offline" in last


# ---------------------------------------------------------------------- export and gguf targets
def only_our_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("hf-pretrain")]


def test_an_export_into_a_place_that_cannot_be_written_is_one_line(reference_run, tmp_path, capsys):
    from hf_pretrain.publish import export_command

    run_dir, _ = reference_run
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert export_command.main(["--checkpoint", str(run_dir), "--out", str(a_file / "model")]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err and only_our_lines(err) == [
        f"hf-pretrain export: error: cannot write {a_file / 'model'}: {a_file} is a file, not a folder; choose an "
        "--out on a writable disk"
    ]
    assert a_file.read_text() == "mine"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, which nobody can write into")
def test_an_export_onto_a_pseudo_filesystem_is_one_line(reference_run, capsys):
    from hf_pretrain.publish import export_command

    assert export_command.main(["--checkpoint", str(reference_run[0]), "--out", "/proc/model"]) == EXIT_CONFIG
    assert only_our_lines(capsys.readouterr().err) == [
        "hf-pretrain export: error: cannot write /proc/model: /proc cannot be written (No such file or directory); "
        "choose an --out on a writable disk"
    ]


def test_gguf_out_a_folder_or_a_new_folder(exported, tmp_path, capsys):
    from hf_pretrain.publish import gguf

    assert gguf.main([str(exported), "--out", str(tmp_path)]) != 0
    lines = only_our_lines(capsys.readouterr().err)
    fix = str(tmp_path / f"{exported.name}-f16.gguf")
    assert lines == [f"hf-pretrain gguf: --out {tmp_path} is a folder; give the file to write, e.g. --out {fix}"]
    assert gguf.main([str(exported), "--out", fix]) == 0  # the printed fix works
    # an existing file: a GGUF only with --overwrite, a user's other file never (was replaced silently)
    assert gguf.main([str(exported), "--out", fix]) == EXIT_CONFIG
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert gguf.main([str(exported), "--out", fix, "--overwrite"]) == 0
    notes = tmp_path / "notes.gguf"
    notes.write_text("the user's own file")
    assert gguf.main([str(exported), "--out", str(notes), "--overwrite"]) == EXIT_CONFIG
    assert "is not a GGUF file; it is never replaced" in capsys.readouterr().err
    assert notes.read_text() == "the user's own file"
    assert gguf.main([str(exported), "--out", str(tmp_path / "new" / "model.gguf")]) == 0  # its folder is made
    assert (tmp_path / "new" / "model.gguf").stat().st_size > 0


# ---------------------------------------------------------------------- printed fixes that work when pasted
def test_the_doctors_bench_command_for_a_recipe_file_names_the_file_and_the_changed_keys(tmp_path, monkeypatch):
    """It said `hf-pretrain bench --recipe mine` for a recipe given as a file whose name is `mine`: no
    such shipped recipe, so the pasted command failed."""
    import re
    import shlex

    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.preflight.budget import check_cost
    from tests.helpers import ROOT

    recipe_file = tmp_path / "mine.yaml"
    text = (ROOT / "hf_pretrain" / "recipes" / "smoke.yaml").read_text()
    recipe_file.write_text(re.sub(r"(?m)^name: smoke", "name: mine", text))
    argv = ["--recipe", str(recipe_file), "--hidden_size", "64", "--expected_tokens_per_s", "0"]
    monkeypatch.setattr("sys.argv", ["hf-pretrain", "doctor", *argv])
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    fix = check_cost(recipe).fix
    command = re.findall(r"`(hf-pretrain bench [^`]*)`", fix)
    assert len(command) == 1 and f"--recipe {recipe_file}" in command[0], fix
    pasted, _ = parse_recipe_args(shlex.split(command[0])[2:], prog="test", description="")
    assert (pasted.name, pasted.model.hidden_size) == ("mine", 64)


# ---------------------------------------------------------------------- prepare: hints that can help
@pytest.fixture
def fixed_tokenizer(tmp_path) -> list[str]:
    """The flags of a tokenizer given as it is (init_from's path: no fit, the documents meet datatrove first)."""
    import random

    from hf_pretrain.data.tokenizer import save_tokenizer, train_tokenizer
    from tests.test_prepare import VOCAB, _document

    tokenizer = train_tokenizer([_document(random.Random(1)) for _ in range(200)], VOCAB, [])
    save_tokenizer(tokenizer, tmp_path / "t")
    return ["--tokenizer", str(tmp_path / "t" / "tokenizer"), "--vocab_size", str(len(tokenizer))]


@pytest.mark.parametrize("content", [b"", b"\n\n   \n\t\n"], ids=["empty", "blank"])
@pytest.mark.parametrize("tokenizer", ["train", "fixed"])
def test_a_source_file_without_text_is_named_with_a_fix_that_can_help(tmp_path, request, content, tokenizer):
    """With a tokenizer given as it is, an empty file was 'no validation tokens ... lower val_every', and
    a blank one, fitted, 'too small to learn that many tokens: lower vocab_size'."""
    from tests.test_prepare_safety import prepare_cli, write_jsonl

    good, empty = write_jsonl(tmp_path / "good.jsonl", documents=40), tmp_path / "notes.txt"
    empty.write_bytes(content)
    extra = request.getfixturevalue("fixed_tokenizer") if tokenizer == "fixed" else []
    for sources, index in (([empty], 0), ([good, empty], 1)):
        result = prepare_cli(tmp_path / f"dd-{index}", [{"kind": "files", "paths": [str(p)]} for p in sources], *extra)
        assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"source `{empty}` holds no text" in lines[0], lines
        assert lines[0].endswith("give it files with text, or remove it from --sources"), lines
        assert "val_every" not in lines[0] and "vocab_size" not in lines[0]


def test_a_corpus_of_one_document_says_why_not_to_lower_val_every(tmp_path, fixed_tokenizer):
    from tests.test_prepare_safety import prepare_cli

    one = tmp_path / "essay.txt"
    one.write_text("A short essay of one paragraph, with no blank line in it.\n" * 50)
    result = prepare_cli(tmp_path / "dd", [{"kind": "files", "paths": [str(one)]}], *fixed_tokenizer)
    assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "1 document(s) in all: none to hold out for validation" in line and "lower val_every" not in line
    assert line.endswith("add documents")


# ---------------------------------------------------------------------- a second SIGTERM
@pytest.mark.slow
def test_a_second_sigterm_exits_at_once_with_75_and_a_status_that_says_so(smoke_data, tmp_path):
    """It exited 143, undocumented, and left status.json at `running` (the next start then blamed a kill)."""
    import signal

    from hf_pretrain.exit_codes import EXIT_PREEMPTED
    from hf_pretrain.run_folder.run_dir import RunDir
    from hf_pretrain.training.session import killed_session, read_status
    from tests.test_survival import start_training, wait_for_step

    run_dir = tmp_path / "run"
    # held before step 3, never released: the second signal certainly comes before the graceful stop's
    # save could end the run (a wider model's slow save made it only likely; issue 49)
    process = start_training(smoke_data, run_dir, "hold:3", tmp_path / "release")
    try:
        assert wait_for_step(process, run_dir, 2), process.communicate()[0][-3000:]
        process.send_signal(signal.SIGTERM)
        output = ""
        while "SIGTERM received" not in output:  # the first is heard: the step finishes, then a save
            line = process.stdout.readline()
            assert line, output[-3000:]
            output += line
        process.send_signal(signal.SIGTERM)
        output += communicate_or_diagnose(process, 120)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "SIGTERM again: exiting now, without a checkpoint" in output and "Traceback" not in output
    status = read_status(run_dir)
    assert (status["state"], status["exit_code"], status["rerun"]) == ("preempted", EXIT_PREEMPTED, True), status
    assert status["reason"].startswith("stopped by SIGTERM sent twice: exited at once"), status
    assert killed_session(RunDir(run_dir)) is None  # a rerun is not told of a kill


# ---------------------------------------------------------------------- bench on a recipe whose data is not prepared
def test_bench_slices_the_corpus_of_a_recipe_not_yet_prepared_into_data_it_can_use(tmp_path):
    """The slice (steps + 1 batches) of the smoke corpus, 18 long documents, held none out at val_every=20:
    `hf-pretrain bench --recipe smoke` ended in a DataMismatchError traceback before measuring anything."""
    from hf_pretrain.bench.sweep import recipe_with_data
    from hf_pretrain.config import load_recipe
    from hf_pretrain.data.prepared import check_prepared_data
    from tests.helpers import data_of

    said: list[str] = []
    recipe = load_recipe("smoke", {"data_dir": str(tmp_path / "not-prepared")})
    sliced = recipe_with_data(recipe, data_of(recipe), tmp_path / "bench", steps=20, say=said.append)
    check_prepared_data(sliced, data_of(sliced))  # raises if it cannot be used
    assert sliced.data.data_dir == str(tmp_path / "bench" / "data") and "cannot be used" in said[0]


# ---------------------------------------------------------------------- report on what is not a run folder
@pytest.mark.parametrize("where", ["missing", "a data folder"])
def test_report_on_what_is_not_a_run_folder_says_so(tmp_path, capsys, where):
    pytest.importorskip("matplotlib")
    from hf_pretrain.run_commands import report

    folder = tmp_path / "runs" / "typo"
    if where == "a data folder":
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
    assert report.main([str(folder)]) == EXIT_CONFIG
    said = (
        "no such folder"
        if where == "missing"
        else "no training records (no metrics.jsonl): not a run folder, or no step trained yet"
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"hf-pretrain report: error: {folder}: {said}; give a run folder (the recipe's output_dir)"]


# ---------------------------------------------------------------------- space: what a Space can load, where it goes
def test_space_of_a_local_export_says_a_space_reads_the_hub_and_an_unwritable_out_is_one_line(tmp_path, capsys):
    from hf_pretrain.publish import space

    export = tmp_path / "export"
    export.mkdir()
    assert space.main(["--model", str(export), "--out", str(tmp_path / "space")]) == EXIT_CONFIG
    assert only_our_lines(capsys.readouterr().err) == [
        f"hf-pretrain space: --model {export} is a local folder, and a Space loads its models from the Hub: push it "
        "first (`hf-pretrain export ... --push_to_hub ME/NAME`), then give --model ME/NAME"
    ]
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert space.main(["--model", "me/model", "--out", str(a_file / "space")]) == EXIT_CONFIG
    assert only_our_lines(capsys.readouterr().err) == [
        f"hf-pretrain space: cannot write {a_file / 'space'}: {a_file} is a file, not a folder; choose an --out on "
        "a writable disk"
    ]
    assert not (tmp_path / "space").exists()


# ---------------------------------------------------------------------- check and launch: one line, not a traceback
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--parts", ""], "--parts '' names no part; choose from health,"),
        (["--output", "/proc/hf-pretrain-check"], "--output /proc/hf-pretrain-check: /proc cannot be written ("),
    ],
    ids=["no part", "a read-only output"],
)
def test_a_check_given_nothing_to_run_or_nowhere_to_write_is_one_line(flags, said):
    """Issue 57: `check --parts ""` was an IndexError, `--output` on a read-only filesystem an OSError."""
    from tests.helpers import cli

    if flags[0] == "--output" and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, which nobody can write into")
    run = cli("check", "--recipe", "smoke", *flags, timeout=120)
    assert run.returncode == EXIT_CONFIG and "Traceback" not in run.stderr, run.stderr[-2000:]
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hf-pretrain check: error: {said}"), err
    assert err[0].endswith(("choose another --output", "all_reduce")), err[0]


MULTI_NODE = "--num_machines 2 --machine_rank 0 --main_process_ip 127.0.0.1 --main_process_port 29555"


@pytest.mark.parametrize(
    ("config", "flags", "said"),
    [
        ("num_machines: 1\n  num_processes: [1\n", "", "the launch config {config} is not YAML (line 2: "),
        ("- a list\n- of things\n", "", "the launch config {config} is no `key: value` mapping"),
        ("distributed_type: BOGUS\nnum_machines: 1\nnum_processes: 1\nuse_cpu: true\n", "", "'BOGUS' is not a valid"),
        ("distributed_type: 'NO'\nuse_cpu: true\nmixed_precision: fp7\n", "", "Unknown mixed_precision mode: fp7"),
        # a multi-node task's `$((SKYPILOT_NUM_NODES*SKYPILOT_NUM_GPUS_PER_NODE))` with the second empty: 0
        (None, f"{MULTI_NODE} --num_processes 0", "--num_processes '0': a process count of at least 1"),
        (None, f"{MULTI_NODE} --num_processes 3", "--num_processes 3 does not split over --num_machines 2"),
    ],
    ids=["not yaml", "not a mapping", "a wrong distributed_type", "a wrong mixed_precision", "0 processes", "3 on 2"],
)
def test_a_launch_whose_config_or_flags_accelerate_refuses_is_one_line_and_78(config, flags, said, tmp_path):
    """Issue 57: accelerate's ValueError (a config that is not YAML, a wrong value) and torch's AssertionError
    (no process per machine) were tracebacks with exit 1, which an engine's task reads as a crash: bad input
    is one line and 78, never rerun."""
    from tests.helpers import ROOT, TRAIN_SCRIPT, cli

    path = ROOT / "accelerate_configs" / "ddp.yaml"
    if config is not None:
        path = tmp_path / "launch.yaml"
        path.write_text(config)
    argv = ["launch", "--config_file", str(path), *flags.split(), str(TRAIN_SCRIPT), "--recipe", "smoke"]
    run = cli(*argv, cwd=tmp_path, timeout=300)
    assert run.returncode == EXIT_CONFIG and "Traceback" not in run.stderr, run.stderr[-3000:]
    ours = [line for line in run.stderr.splitlines() if line.startswith("hf-pretrain launch")]
    assert len(ours) == 1 and said.format(config=path) in ours[0], run.stderr[-3000:]
    assert "pid." not in run.stdout and "step 1" not in run.stdout  # refused before any trainer began
