"""`hf-pretrain eval`: lm-eval on local ARC, the reference table, the card, benchmarks.jsonl, bits per byte."""

from __future__ import annotations

import json
import math
import shutil

import evaluate
import pytest
import torch
import torch.nn.functional as F
import yaml
from huggingface_hub import EvalResult, ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_pretrain.evaluation import eval_command
from hf_pretrain.evaluation import harness as evaluation
from hf_pretrain.evaluation.scores import METRICS, REFERENCE_SCORES, Score, comparison_table, load_references
from hf_pretrain.publish.model_card import write_eval_section
from hf_pretrain.run_folder.run_dir import read_jsonl
from tests.helpers import ROOT

ARC = ROOT.parent / "shared" / "data" / "arc"
needs_arc = pytest.mark.skipif(
    not ARC.is_dir(),
    reason="../shared/data/arc is absent (a user's clone has no ../shared): the local ARC tasks need its JSONL files",
)
# Held-out text that every Python install has, longer than the smoke model's 512-token context.
HELD_OUT = (" ".join(shutil.__doc__.split()) + "\n" + " ".join(json.__doc__.split()) + "\n") * 4


@pytest.fixture
def fresh_export(exported, tmp_path):
    """A copy of the export whose card the test may change."""
    return shutil.copytree(exported, tmp_path / "tiny")


@pytest.mark.slow
@needs_arc
def test_eval_scores_local_arc_beside_the_references_and_fills_the_card(fresh_export, tmp_path):
    output = tmp_path / "results"
    assert (
        eval_command.main(
            [
                "--model",
                str(fresh_export),
                "--tasks",
                "arc_easy_local,arc_challenge_local",
                "--limit",
                "20",
                "--data_dir",
                str(ARC),
                "--output",
                str(output),
            ]
        )
        == 0
    )
    results = json.loads((output / "results.json").read_text())  # lm-eval's own
    for task in ("arc_easy_local", "arc_challenge_local"):
        assert results["n-samples"][task]["effective"] == 20
        assert {"acc,none", "acc_stderr,none", "acc_norm,none", "acc_norm_stderr,none"} <= set(results["results"][task])
    page = (output / "results.md").read_text()
    # pushed with an export: named by the folder's name, no path of this machine (issue 57: `# /abs/path`)
    assert page.splitlines()[0] == "# tiny" and str(tmp_path) not in page, page.splitlines()[0]
    rows = {
        tuple(cell.strip() for cell in line.split("|")[1:3]): line
        for line in page.splitlines()
        if line.startswith("| arc_")
    }
    # TinyLlama's ARC-Easy number is acc_norm: it stands in that row and only there
    assert "55.25" in rows[("arc_easy_local", "acc_norm")] and "55.25" not in rows[("arc_easy_local", "acc")]
    # GPUburnout publishes ARC-Easy as acc
    assert "47.10" in rows[("arc_easy_local", "acc")] and "47.10" not in rows[("arc_easy_local", "acc_norm")]

    card = ModelCard.load(fresh_export / "README.md")
    entries = card.data.eval_results
    assert {(e.dataset_config, e.metric_type) for e in entries} == {
        ("ARC-Easy", "acc"),
        ("ARC-Easy", "acc_norm"),
        ("ARC-Challenge", "acc"),
        ("ARC-Challenge", "acc_norm"),
    }
    assert all(
        e.dataset_type == "allenai/ai2_arc" and e.dataset_args == {"num_few_shot": 0, "limit": 20} for e in entries
    )
    easy_acc = next(e for e in entries if e.dataset_config == "ARC-Easy" and e.metric_type == "acc")
    assert easy_acc.metric_value == round(100 * results["results"]["arc_easy_local"]["acc,none"], 2)
    assert "Not evaluated yet" not in card.text and "| arc_easy_local | acc_norm |" in card.text


@pytest.mark.slow
@needs_arc
def test_evaluate_checkpoint_appends_a_record_per_call(reference_run, tmp_path):
    run_dir, _ = reference_run
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000012"
    shutil.copytree(run_dir / "checkpoints" / "step_00000012", checkpoint)
    record = evaluation.evaluate_checkpoint(checkpoint, ["arc_easy_local"], 10, data_dir=ARC)
    assert record["step"] == 12 and record["tokens"] == 24576 and record["limit"] == 10
    scores = record["tasks"]["arc_easy_local"]
    assert set(scores) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert 0 <= scores["acc"] <= 100  # percent
    assert read_jsonl(tmp_path / "run" / "benchmarks.jsonl") == [record]


@pytest.mark.slow
def test_bits_per_byte_metric_loads_offline_and_sums_every_token_once(exported):
    metric = evaluate.load(str(evaluation.BITS_PER_BYTE_METRIC))
    text = HELD_OUT[:1000]
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) < 500  # fits one window: the metric must equal one plain forward pass
    full = torch.tensor([[tokenizer.bos_token_id, *ids]])
    with torch.no_grad():
        nll = F.cross_entropy(model(input_ids=full).logits[0, :-1].float(), full[0, 1:], reduction="sum").item()
    result = metric.compute(predictions=[text], model_id=str(exported), device="cpu")
    assert result["tokens"] == len(ids) and result["bytes"] == len(text.encode())
    assert result["bits_per_byte"] == pytest.approx(nll / math.log(2) / len(text.encode()), rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(nll / len(ids)), rel=1e-5)
    # in overlapping windows every token is still scored once, with a little less context
    windowed = metric.compute(predictions=[text], model_id=str(exported), device="cpu", window=64, stride=48)
    assert windowed["tokens"] == len(ids)
    assert windowed["bits_per_byte"] == pytest.approx(result["bits_per_byte"], rel=0.05)
    with pytest.raises(ValueError, match="must overlap"):
        metric.compute(predictions=[text], model_id=str(exported), device="cpu", window=64, stride=64)


@pytest.mark.slow
def test_eval_text_only_reports_bits_per_byte_on_the_card(fresh_export, tmp_path):
    text_file = tmp_path / "held_out.txt"
    text_file.write_text(HELD_OUT)
    assert eval_command.main(["--model", str(fresh_export), "--tasks", "none", "--text", str(text_file)]) == 0
    metrics = json.loads((fresh_export / "eval" / "text_metrics.json").read_text())
    assert metrics["tokens"] > 512 and metrics["bits_per_byte"] > 0  # longer than the context: windows
    card = ModelCard.load(fresh_export / "README.md")
    assert "bits per byte" in card.text and not card.data.eval_results


def test_card_blocks_are_replaced_one_at_a_time(fresh_export):
    result = EvalResult(
        task_type="text-generation",
        dataset_type="allenai/ai2_arc",
        dataset_name="arc_easy",
        metric_type="acc",
        metric_value=30.0,
    )
    assert write_eval_section(fresh_export, "eval", "| table v1 |", [result])
    assert write_eval_section(fresh_export, "text", "bits per byte v1")
    assert write_eval_section(fresh_export, "eval", "| table v2 |", [result])
    card = ModelCard.load(fresh_export / "README.md")
    assert "| table v2 |" in card.text and "table v1" not in card.text and "bits per byte v1" in card.text
    assert card.data.eval_results == [result]
    assert not write_eval_section(fresh_export / "eval_missing", "eval", "x")  # no card there: nothing written


def test_default_suite_and_task_lists():
    tasks, shots = evaluation.resolve_tasks("default")
    assert tasks == [
        "arc_easy",
        "arc_challenge",
        "hellaswag",
        "piqa",
        "winogrande",
        "boolq",
        "openbookqa",
        "lambada_openai",
    ]
    assert shots == 0
    assert evaluation.resolve_tasks("arc_easy, piqa") == (["arc_easy", "piqa"], None)
    assert evaluation.resolve_tasks("none") == ([], None)


def test_reference_scores_name_their_metric_and_source():
    references = load_references()
    suite, _ = evaluation.resolve_tasks("default")
    assert references["num_fewshot"] == 0
    assert {m["name"] for m in references["models"]} == {
        "TinyLlama-1.1B (3T)",
        "Pythia-1B",
        "OPT-1.3B",
        "GPUburnout-1B",
    }
    for model in references["models"]:
        assert model["source"] and model["note"] and model["hub_id"]
        assert set(model["scores"]) == set(suite), model["name"]  # every task listed, unknown ones as null
        for task, by_metric in model["scores"].items():
            assert len(by_metric) == 1 and set(by_metric) <= set(METRICS), (model["name"], task)
            value = next(iter(by_metric.values()))
            assert value is None or 0 < value < 100
    assert yaml.safe_load(REFERENCE_SCORES.read_text()) == references


def test_comparison_table_never_sets_numbers_of_different_metrics_side_by_side():
    references = {
        "num_fewshot": 0,
        "models": [{"name": "Ref", "source": "s", "scores": {"hellaswag": {"acc_norm": 59.2}, "boolq": {"acc": 57.8}}}],
    }
    scores = [
        Score("hellaswag", "hellaswag", "acc", 40.0, 1.0, 0, 2000),
        Score("hellaswag", "hellaswag", "acc_norm", 45.0, 1.1, 0, 2000),
        Score("boolq", "boolq", "acc", 60.0, 2.0, 0, 2000),
    ]
    rows = [
        line
        for line in comparison_table(scores, references, 20).splitlines()
        if line.startswith("| hellaswag") or line.startswith("| boolq")
    ]
    assert rows == [
        "| hellaswag | acc | 40.00 ± 1.00 | — |",
        "| hellaswag | acc_norm | 45.00 ± 1.10 | 59.20 |",
        "| boolq | acc | 60.00 ± 2.00 | 57.80 |",
    ]
    few_shot = [Score("hellaswag", "hellaswag", "acc_norm", 45.0, 1.1, 5, 20)]
    table = comparison_table(few_shot, references)
    assert "59.20" not in table and "not shown beside a run with another number of shots" in table


def test_a_score_within_the_noise_of_chance_says_so():
    """Issue 38: a 1.3M-parameter model's 30.5 on ARC read as above TinyLlama's 30.1; on 200 documents of a
    four-choice task, 2 sigma of guessing is 25% +- 6.1 points, so 30.5 is chance, and 31.5 is not."""
    references = load_references()
    near = Score("arc_challenge_local", "arc_challenge", "acc_norm", 30.5, 3.3, 0, 200)
    clear = Score("arc_challenge_local", "arc_challenge", "acc_norm", 31.5, 3.3, 0, 200)
    two_choices = Score("piqa", "piqa", "acc", 53.0, 1.2, 0, 1838)  # 2 sigma of a coin over 1,838: 2.3 points
    table = comparison_table([near, clear, two_choices], references, 200)
    rows = [line for line in table.splitlines() if line.startswith("| arc_challenge_local") or "| piqa" in line]
    assert "30.50 ± 3.30 (chance)" in rows[0] and "(chance)" not in rows[1] and "(chance)" not in rows[2]
    assert "within two binomial standard deviations of guessing" in table
    assert "(chance)" not in comparison_table([clear], references, 200)


def test_local_tasks_say_which_data_they_need_and_where_to_get_them(tmp_path):
    """The refusal named no file and no source (issue 45): now the files a zero-shot run reads, and the
    one command that writes them from the Hub dataset."""
    with pytest.raises(evaluation.EvalError) as refused:
        evaluation.run_lm_eval(None, None, ["arc_easy_local"])
    said = str(refused.value)
    assert "--data_dir with the folder that holds ARC-Easy-test.jsonl;" in said and "train" not in said
    assert "load_dataset('allenai/ai2_arc', 'ARC-Easy', split='test').to_json('ARC-Easy-test.jsonl')" in said
    with pytest.raises(evaluation.EvalError, match=r"needs .*-train\.jsonl .* does not exist"):
        evaluation.local_tasks(tmp_path / "empty", tmp_path / "tasks", num_fewshot=5)


def test_a_zero_shot_local_task_neither_needs_nor_reads_the_train_and_validation_files(tmp_path):
    """Empty train/validation files stopped `datasets` in a StopIteration traceback, and the task demanded
    them although a zero-shot run reads neither (issue 45)."""
    arc = tmp_path / "arc"
    arc.mkdir()
    (arc / "ARC-Easy-test.jsonl").write_text('{"id": "1"}\n')
    written = evaluation.local_tasks(arc, tmp_path / "tasks", ["arc_easy_local"], num_fewshot=0)
    config = yaml.safe_load((written / "arc_easy_local.yaml").read_text())
    assert config["dataset_kwargs"]["data_files"] == {"test": str(arc.resolve() / "ARC-Easy-test.jsonl")}
    assert config["training_split"] is None and config["validation_split"] is None


def test_a_local_task_needs_only_its_own_files(tmp_path):
    """Issue 38: arc_easy_local was refused when the ARC-Challenge files were absent."""
    easy = tmp_path / "arc"
    easy.mkdir()
    needed = yaml.safe_load((evaluation.LOCAL_TASKS_DIR / "arc_easy_local.yaml").read_text())
    for name in needed["dataset_kwargs"]["data_files"].values():
        (easy / name).write_text("")
    written = evaluation.local_tasks(easy, tmp_path / "tasks", ["arc_easy_local"], num_fewshot=5)
    assert [p.name for p in written.glob("*.yaml")] == ["arc_easy_local.yaml"]
    with pytest.raises(evaluation.EvalError, match="arc_challenge_local needs"):
        evaluation.local_tasks(easy, tmp_path / "both", ["arc_easy_local", "arc_challenge_local"], num_fewshot=5)


@pytest.mark.slow
def test_unknown_task_is_named(exported):
    model, tokenizer = evaluation.load_model(str(exported), torch.float32, "cpu")
    with pytest.raises(evaluation.EvalError, match="no_such_task"):
        evaluation.run_lm_eval(model, tokenizer, ["arc_easy", "no_such_task"])


def test_results_json_keeps_file_names_never_this_machines_paths():
    """eval/results.json, in the folder a user pushes, held the ARC files' and a temporary task file's
    absolute paths (issue 45)."""
    results = {
        "configs": {
            "arc_easy_local": {
                "dataset_kwargs": {"data_files": {"test": "/home/ann/data/arc/ARC-Easy-test.jsonl"}},
                "doc_to_text": "Question: {{question}}\nAnswer: and/or 1/2",
            }
        },
        "config": {"model_args": "pretrained=/srv/ann/exports/1b,dtype=bf16", "include": ["/tmp/tmpab12/tasks/x.yaml"]},
        "url": "https://github.com/EleutherAI/lm-evaluation-harness/blob/main/README.md",
        "n": 3,
    }
    kept = evaluation.without_local_paths(results)
    text = json.dumps(kept)
    assert "/home/" not in text and "/srv/" not in text and "/tmp/" not in text
    assert kept["configs"]["arc_easy_local"]["dataset_kwargs"]["data_files"]["test"] == "ARC-Easy-test.jsonl"
    assert kept["config"]["model_args"] == "pretrained=1b,dtype=bf16" and kept["config"]["include"] == ["x.yaml"]
    assert kept["url"] == results["url"] and kept["n"] == 3
    assert kept["configs"]["arc_easy_local"]["doc_to_text"] == results["configs"]["arc_easy_local"]["doc_to_text"]


def test_lm_evals_warnings_about_the_model_object_and_gits_complaint_stay_off_the_screen(
    tmp_path, monkeypatch, capfd, caplog
):
    """Every `eval` printed "fatal: not a git repository" and a warning about the `pretrained` kwarg (issue 45)."""
    import logging

    import lm_eval.evaluator

    from hf_pretrain.evaluation.quiet import quiet_lm_eval

    monkeypatch.chdir(tmp_path)  # not a checkout
    logger = logging.getLogger("lm_eval.models.huggingface")
    with quiet_lm_eval():
        logger.warning("`pretrained` model kwarg is not of type `str`. Many other model arguments may be ignored.")
        logger.warning("Passed an already-initialized model through `pretrained`, assuming single-process call")
        logger.warning("a warning that matters")
        assert lm_eval.evaluator.get_git_commit_hash() is None
    out, err = capfd.readouterr()
    assert "fatal" not in out + err
    assert [r.getMessage() for r in caplog.records if r.name == logger.name] == ["a warning that matters"]
    assert lm_eval.evaluator.get_git_commit_hash is not None and not logger.filters  # all as it was after
