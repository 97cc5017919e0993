"""The lm-eval tasks `lm_eval_tasks` names, known before training: the benchmark side job scores each saved
checkpoint with them (publish/side_jobs.py), and a misspelt one would fail only as a warning at every
checkpoint, hours in. Checked as `hf-pretrain eval` checks its --tasks (evaluation/harness.py)."""

from __future__ import annotations

from importlib.util import find_spec

from hf_pretrain.config import EvaluationConfig
from hf_pretrain.extras import install_line
from hf_pretrain.preflight.result import CheckResult

NAME = "lm-eval tasks"


def check_lm_eval_tasks(evaluation: EvaluationConfig) -> CheckResult:
    tasks = evaluation.lm_eval_tasks
    if not tasks:
        return CheckResult(NAME, "skip", "lm_eval_tasks is empty: no checkpoint is scored")
    if find_spec("lm_eval") is None:
        return CheckResult(
            NAME,
            "fail",
            f"lm_eval_tasks names {', '.join(tasks)}, and lm-eval is not installed",
            install_line("eval"),
        )
    from hf_pretrain.evaluation.harness import EvalError, check_task_names

    try:
        check_task_names(list(tasks), [])
    except EvalError as exc:
        unknown = str(exc).split(";")[0].removeprefix("unknown task(s) or suite: ")
        return CheckResult(
            NAME,
            "fail",
            f"lm_eval_tasks names {unknown}, which lm-eval does not know",
            "--lm_eval_tasks with names of `lm_eval ls tasks` or the offline tasks (e.g. --lm_eval_tasks arc_easy)",
        )
    return CheckResult(NAME, "pass", f"{', '.join(tasks)}: lm-eval knows them")
