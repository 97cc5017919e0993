"""The work of `hf-pretrain eval` (evaluation/eval_command.py reads its flags): score a model with
lm-evaluation-harness and set it beside reference models.


    hf-pretrain eval --model exports/1b                        # the default zero-shot suite (eval/suites/default.yaml)
    hf-pretrain eval --model exports/1b --tasks arc_easy,hellaswag --limit 200
    hf-pretrain eval --model exports/1b --tasks arc_easy_local,arc_challenge_local --data_dir data/arc
    hf-pretrain eval --model exports/1b --tasks none --text held_out.txt    # perplexity and bits per byte only

`--model` is an exported folder, a Hub repo id, a run folder or a checkpoint. Results go to
`--output` (default: `<model folder>/eval`): lm-eval's own `results.json` and `results.md`, a
table of this model beside the references in eval/reference_scores.yaml. Pointed at an export,
the scores also go into its model card (`model-index` and the Evaluation section).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_pretrain.checkpoints.load import load_checkpoint_model
from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.store import is_training_output, resolve_checkpoint
from hf_pretrain.evaluation.quiet import quiet_lm_eval
from hf_pretrain.evaluation.scores import (
    EVAL_DIR,
    comparison_table,
    eval_results,
    load_references,
    scores_from_results,
    without_local_paths,
)
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.machine.run_profile import inference_device_and_dtype, this_machine
from hf_pretrain.publish.model_card import write_eval_section
from hf_pretrain.run_folder.run_dir import JsonlWriter, RunDir

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

SUITES_DIR = EVAL_DIR / "suites"
LOCAL_TASKS_DIR = EVAL_DIR / "tasks"
BITS_PER_BYTE_METRIC = EVAL_DIR / "metrics" / "bits_per_byte"
# lm-eval's automatic batch size probes for CUDA out-of-memory; on a CPU it would try batches of
# up to 64 full-length sequences, so the CPU gets a fixed batch instead.
CPU_BATCH_SIZE = 8


class EvalError(RuntimeError):
    """An evaluation that cannot run as asked, with the reason."""


def resolve_tasks(spec: str) -> tuple[list[str], int | None]:
    """Tasks and the suite's shot count for `--tasks`: a suite name in eval/suites, a suite YAML,
    `none`, or comma-separated lm-eval task names (shots then come from --num_fewshot or lm-eval)."""
    if spec == "none":
        return [], None
    path = Path(spec) if spec.endswith((".yaml", ".yml")) else SUITES_DIR / f"{spec}.yaml"
    if spec.endswith((".yaml", ".yml")) and not path.is_file():
        raise EvalError(f"--tasks {spec}: no such suite file; the shipped suites: {', '.join(suite_names())}")
    if path.is_file():
        suite = yaml.safe_load(path.read_text())
        return list(suite["tasks"]), suite.get("num_fewshot")
    return [t.strip() for t in spec.split(",") if t.strip()], None


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def check_task_names(tasks: list[str], include_paths: list[str]) -> None:
    """Raise `EvalError` naming the tasks neither lm-eval, --include_path nor eval/tasks knows, with
    what there is: before a model is loaded for them (minutes for a big one)."""
    known = known_task_names(tuple(include_paths)) | _local_task_names()
    unknown = [task for task in tasks if task not in known]
    if unknown:
        raise EvalError(
            f"unknown task(s) or suite: {', '.join(unknown)}; the suites: {', '.join(suite_names())} (eval/suites), "
            f"the offline tasks: {', '.join(sorted(_local_task_names()))} (eval/tasks, with --data_dir), lm-eval's: "
            f"`lm_eval ls tasks` (or add yours with --include_path)"
        )


@functools.cache
def task_index(include_paths: tuple[str, ...] = ()) -> TaskManager:
    """lm-eval's `TaskManager` of its own tasks and `include_paths`: it reads thousands of YAML files
    (about 10 s of a core), so once per process, shared by the name check and the run."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include_paths) or None)


def known_task_names(include_paths: tuple[str, ...] = ()) -> frozenset[str]:
    """Every task lm-eval knows (with `include_paths`)."""
    return frozenset(task_index(include_paths).all_tasks)


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with `hf-pretrain eval`'s flags, in a line with what to give instead; None if nothing.
    Checked before any model is loaded or any task is read."""
    limit = args.limit
    if limit is not None and not (0 < limit < 1 or (limit >= 1 and limit == int(limit))):
        return f"--limit {limit:g}: give a number of documents (a whole number, 1 or more) or a fraction between 0 and 1, e.g. --limit 200 or --limit 0.1"
    if args.num_fewshot is not None and args.num_fewshot < 0:
        return f"--num_fewshot {args.num_fewshot}: give 0 (zero-shot) or more examples per prompt"
    batch = args.batch_size
    if batch is not None and not (
        (batch.isdigit() and int(batch) > 0) or batch == "auto" or re.fullmatch(r"auto:[1-9]\d*", batch)
    ):
        return (
            f"--batch_size {batch}: give a whole number of 1 or more, `auto` or `auto:N` (N tries), e.g. --batch_size 8"
        )
    if args.text is not None and not args.text.is_file():
        return f"--text {args.text}: no such file; give a text file to measure perplexity and bits per byte on"
    if args.data_dir is not None and not args.data_dir.is_dir():
        return f"--data_dir {args.data_dir}: no such folder; give the folder that holds the offline tasks' files (e.g. ARC-Easy-test.jsonl)"
    for folder in args.include_path:
        if not Path(folder).is_dir():
            return f"--include_path {folder}: no such folder of lm-eval task YAMLs"
    if not Path(args.model).exists() and not HUB_ID.fullmatch(args.model):
        return (
            f"--model {args.model}: no such folder, and not a Hub repo id (owner/name); give an `hf-pretrain export` "
            f"folder, a run folder or checkpoint, or a repo id"
        )
    return None


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def local_tasks(data_dir: Path, into: Path, tasks: list[str] | None = None, num_fewshot: int | None = None) -> Path:
    """A copy of eval/tasks (those in `tasks`, when given) whose `data_files` name files inside `data_dir`
    (they must exist: only the asked tasks' files, so ARC-Easy runs without ARC-Challenge's). A zero-shot
    run (`num_fewshot` 0 or unset) reads only the test split: the train and validation files are left out,
    neither required nor opened (an empty one would stop `datasets` in a traceback)."""
    into.mkdir(parents=True, exist_ok=True)
    for source in sorted(LOCAL_TASKS_DIR.glob("*.yaml")):
        config = local_task_config(yaml.safe_load(source.read_text())["task"], num_fewshot)
        if tasks is not None and config["task"] not in tasks:
            continue
        data_files = (config.get("dataset_kwargs") or {}).get("data_files") or {}
        for split, name in data_files.items():
            path = (data_dir / name).resolve()
            if not path.is_file():
                raise EvalError(
                    f"task {config['task']} needs {path} (split {split}), which does not exist; --data_dir must "
                    f"hold {', '.join(data_files.values())}: {local_files_hint(config)}"
                )
            data_files[split] = str(path)
        (into / source.name).write_text(yaml.safe_dump(config, sort_keys=False))
    return into


def local_files_hint(config: dict[str, Any]) -> str:
    """Where the files of an offline task come from: its Hub dataset, each split written as JSONL by
    `datasets` on a machine that reaches the Hub (docs/publish.md, "Offline")."""
    meta = config.get("metadata") or {}
    dataset, name = meta.get("hub_dataset"), meta.get("hub_config")
    files = (config.get("dataset_kwargs") or {}).get("data_files") or {}
    writes = "; ".join(
        f"load_dataset('{dataset}', '{name}', split='{split}').to_json('{Path(file).name}')"
        for split, file in files.items()
    )
    return f'write them once where the Hub is reachable: python -c "from datasets import load_dataset; {writes}"'


def local_task_config(task: str, num_fewshot: int | None = None) -> dict[str, Any]:
    """The offline task's YAML as a run with `num_fewshot` reads it (zero-shot: its test split only)."""
    source = next(p for p in LOCAL_TASKS_DIR.glob("*.yaml") if yaml.safe_load(p.read_text())["task"] == task)
    config = yaml.safe_load(source.read_text())
    if not num_fewshot:  # lm-eval then takes its (unused) few-shot pool from the test split
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {"test": files["test"]}
        config["training_split"] = config["validation_split"] = None  # over what an `include` sets
    return config


def _local_task_names() -> set[str]:
    return {yaml.safe_load(p.read_text())["task"] for p in LOCAL_TASKS_DIR.glob("*.yaml")}


# What a model folder needs for `from_pretrained`: its config, weights in one of these forms, a tokenizer.
MODEL_FOLDER_NEEDS = {
    "config.json": ("config.json",),
    "weights": (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ),
    "tokenizer.json": ("tokenizer.json", "tokenizer.model", "vocab.json"),
}


def check_model_folder(folder: Path) -> None:
    """Raise `EvalError` naming what a local model folder lacks, or a JSON file of it that is cut short,
    before transformers meets it (its errors speak of sentencepiece and `model_type`, not of the file)."""
    for what, names in MODEL_FOLDER_NEEDS.items():
        if not any((folder / name).is_file() for name in names):
            missing = what if what != "weights" else "model.safetensors (no weights)"
            raise EvalError(
                f"{folder} has no {missing}: not a whole model folder. Export it again "
                f"(`hf-pretrain export --checkpoint RUN_DIR --out {folder} --overwrite`), or point --model at "
                f"the run folder or a checkpoint"
            )
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        path = folder / name
        try:
            json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError) as exc:
            raise EvalError(f"{path} cannot be read ({exc}): the file is truncated or damaged; export again") from None


def load_model(source: str, dtype: torch.dtype, device: str):
    """(model, tokenizer) from a checkpoint or run folder, an exported folder or a Hub repo id."""
    if is_training_output(source):
        checkpoint = resolve_checkpoint(source, checksums=False)
        model, tokenizer_source = load_checkpoint_model(checkpoint.path, dtype), checkpoint.path
    else:
        try:
            model, tokenizer_source = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).eval(), source
        except OSError as exc:  # not on the Hub, not in the cache offline, no network: transformers' words
            raise EvalError(f"cannot load the model {source}: {str(exc).splitlines()[0]}") from None
    return model.to(device), AutoTokenizer.from_pretrained(tokenizer_source)


def run_lm_eval(
    model,
    tokenizer,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    include_paths: list[str] | None = None,
    data_dir: str | Path | None = None,
    batch_size: int | str | None = None,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on an in-memory model; returns lm-eval's results dictionary."""
    # lm-eval is imported here, not at the top: its import is slow and optional (`pip install
    # 'hf-pretrain[eval]'`), and `hf-pretrain eval --tasks none --text FILE` does without it.
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    wanted_local = sorted(set(tasks) & _local_task_names())
    if wanted_local and data_dir is None:
        needs = [local_task_config(task, num_fewshot) for task in wanted_local]
        files = ", ".join(Path(f).name for c in needs for f in c["dataset_kwargs"]["data_files"].values())
        raise EvalError(
            f"{', '.join(wanted_local)} read local files: pass --data_dir with the folder that holds {files}; "
            f"{local_files_hint(needs[0])}"
        )
    if batch_size is None:
        batch_size = "auto" if model.device.type == "cuda" else CPU_BATCH_SIZE
    with tempfile.TemporaryDirectory() as scratch:
        paths = tuple(include_paths or ())
        if data_dir is None:
            task_manager = task_index(paths)
        else:
            offline = str(local_tasks(Path(data_dir), Path(scratch) / "tasks", tasks, num_fewshot))
            # the offline tasks alone need no index of lm-eval's thousands (their YAML includes only each other)
            alone = set(tasks) <= _local_task_names() and not paths
            task_manager = TaskManager(include_path=[*paths, offline], include_defaults=not alone)
        unknown = [t for t in tasks if t not in task_manager.all_tasks]
        if unknown:
            raise EvalError(
                f"unknown lm-eval task(s): {', '.join(unknown)} (see `lm_eval ls tasks`, or --include_path)"
            )
        try:
            with quiet_lm_eval():  # its warnings about the model object passed on purpose, git's complaint
                lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
                return lm_eval.simple_evaluate(
                    model=lm,
                    tasks=tasks,
                    num_fewshot=num_fewshot,
                    limit=limit,
                    task_manager=task_manager,
                    log_samples=False,
                )
        except ConnectionError as exc:  # datasets' words for a dataset neither cached nor reachable (offline)
            local = ", ".join(sorted(_local_task_names()))
            raise EvalError(
                f"a task's dataset is not in the cache and the Hub cannot be reached ({exc}): run it once online to "
                f"cache it, or use the offline tasks ({local}) with --data_dir, a folder of ARC-Easy-test.jsonl and "
                f"ARC-Challenge-test.jsonl ({local_files_hint(local_task_config('arc_easy_local'))}; docs/publish.md, Offline)"
            ) from None


def text_metrics(model: str, text_file: Path, device: str, dtype: torch.dtype) -> dict[str, float]:
    """Perplexity and bits per byte of `model` on a text file, with the local `evaluate` metric, run on
    `device` in `dtype` (the eval's door chose them)."""
    import evaluate

    metric = evaluate.load(str(BITS_PER_BYTE_METRIC))
    return metric.compute(
        predictions=[text_file.read_text(encoding="utf-8")],
        model_id=model,
        device=device,
        dtype=str(dtype).replace("torch.", ""),
    )


def evaluate_checkpoint(
    checkpoint_dir: str | Path,
    tasks: list[str],
    limit: int | float | None,
    *,
    data_dir: str | Path | None = None,
    num_fewshot: int = 0,
) -> dict[str, Any]:
    """Score a checkpoint on a few lm-eval tasks and append the record to RUN_DIR/benchmarks.jsonl.

    The benchmark side job runs it in a process of its own beside training, on a pinned copy of each
    saved checkpoint (publish/side_jobs.py); training itself never imports this module. The record is
    {"step", "tokens", "limit", "num_fewshot", "tasks": {task: {metric: percent, metric_stderr: percent}}}.
    """
    checkpoint = resolve_checkpoint(checkpoint_dir, checksums=False)
    # the side job's door (a process of its own): which machine this is, asked here
    device, dtype = inference_device_and_dtype(this_machine())
    model, tokenizer = load_model(str(checkpoint.path), dtype, device)
    results = run_lm_eval(model, tokenizer, tasks, limit=limit, num_fewshot=num_fewshot, data_dir=data_dir)
    record: dict[str, Any] = {
        "step": checkpoint.train_state.get("step"),
        "tokens": checkpoint.train_state.get("tokens_seen"),
        "limit": limit,
        "num_fewshot": num_fewshot,
        "tasks": {},
    }
    for s in scores_from_results(results):
        record["tasks"].setdefault(s.task, {})[s.metric] = round(s.value, 4)
        record["tasks"][s.task][f"{s.metric}_stderr"] = None if s.stderr is None else round(s.stderr, 4)
    if checkpoint.run_dir is not None:
        JsonlWriter(RunDir(checkpoint.run_dir).benchmarks, enabled=True).write(record)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # hand the evaluation's memory back to the training run
    return record


def _default_output(model: str) -> Path:
    path = Path(model)
    return path / "eval" if path.is_dir() else Path("eval_results") / model.replace("/", "__")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The evaluation asked by eval_command's flags (parsed there, without torch); `parser.error` refuses."""
    problem = argument_problem(args)
    if problem:
        print(f"hf-pretrain eval: error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        tasks, suite_shots = resolve_tasks(args.tasks)
        if tasks:
            check_task_names(tasks, args.include_path)
    except EvalError as exc:
        print(f"hf-pretrain eval: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if not tasks and args.text is None:
        parser.refuse("nothing to do: --tasks none needs --text FILE")
    limit = int(args.limit) if args.limit and args.limit >= 1 else args.limit
    num_fewshot = args.num_fewshot if args.num_fewshot is not None else suite_shots
    output = args.output or _default_output(args.model)
    if args.text is not None and is_training_output(args.model):
        parser.refuse("--text needs a model folder or Hub repo id: `hf-pretrain export` the checkpoint first")
    try:
        if Path(args.model).is_dir() and not is_training_output(args.model):
            check_model_folder(Path(args.model))
        device, dtype = inference_device_and_dtype(this_machine())  # the eval's door: the machine, asked once
        if tasks:
            model, tokenizer = load_model(args.model, dtype, device)
            batch = int(args.batch_size) if args.batch_size and args.batch_size.isdigit() else args.batch_size
            results = run_lm_eval(
                model,
                tokenizer,
                tasks,
                limit=limit,
                num_fewshot=num_fewshot,
                include_paths=args.include_path,
                data_dir=args.data_dir,
                batch_size=batch,
            )
            del model
        if args.text is not None:
            bpb = text_metrics(args.model, args.text, device, dtype)
    except (EvalError, CheckpointError) as exc:
        print(f"hf-pretrain eval: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    output.mkdir(parents=True, exist_ok=True)
    model_folder = Path(args.model) if Path(args.model).is_dir() else None
    if tasks:
        report_benchmarks(
            results, getattr(args, "model_shown", None) or title_of(args.model), output, model_folder, limit
        )
    if args.text is not None:
        report_text_metrics(bpb, args.text, output, model_folder)
    print(f"eval: results in {output}")
    return 0


def title_of(model: str) -> str:
    """How results.md names the model: a local folder by its name alone (an export's eval/ is pushed with it,
    and a path of this machine is no one else's business: issue 57), a Hub repo id or a URL as given."""
    folder = Path(model)
    return folder.resolve().name if folder.is_dir() else model


def report_benchmarks(
    results: dict[str, Any], model: str, output: Path, model_folder: Path | None, limit: int | float | None
) -> None:
    """lm-eval's results.json, the comparison table (results.md, stdout) and, for an export, its card."""
    from lm_eval.utils import handle_non_serializable, make_table

    # lm-eval's own file, without this machine's paths (an export's eval/ is pushed with it)
    kept = without_local_paths(json.loads(json.dumps(results, default=handle_non_serializable)))
    (output / "results.json").write_text(json.dumps(kept, indent=2))
    scores = scores_from_results(results)
    table = comparison_table(scores, load_references(), limit)
    (output / "results.md").write_text(f"# {model}\n\n{table}\n## lm-eval's table\n\n{make_table(results)}")
    print(table)
    if model_folder and write_eval_section(model_folder, "eval", table, eval_results(scores, results, limit)):
        print(f"eval: wrote the scores into {model_folder / 'README.md'} (Evaluation, model-index)")


def report_text_metrics(metrics: dict[str, float], text_file: Path, output: Path, model_folder: Path | None) -> None:
    (output / "text_metrics.json").write_text(json.dumps({"file": str(text_file), **metrics}, indent=2))
    line = (
        f"Held-out text `{text_file.name}`: {metrics['bits_per_byte']:.4f} bits per byte, token perplexity "
        f"{metrics['perplexity']:.2f} ({metrics['tokens']:,} tokens, {metrics['bytes']:,} bytes)."
    )
    print(line)
    if model_folder and write_eval_section(model_folder, "text", line):
        print(f"eval: wrote the text metrics into {model_folder / 'README.md'}")
