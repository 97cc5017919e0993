"""Every preflight check in the order a run meets them (`run_checks`), and `preflight`, which also logs
the table and raises `PreflightError` when any fails. The package's __init__ names these lazily.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

from hf_pretrain.checkpoints.resume_decision import decide_resume
from hf_pretrain.checkpoints.resume_plan import Continuation
from hf_pretrain.checkpoints.resume_rules import plan_continuation
from hf_pretrain.config import CheckpointConfig, DataConfig, Recipe, TrainConfig
from hf_pretrain.data.prepared import check_prepared_data, data_identity
from hf_pretrain.economics.resolved_run import ResolvedRun
from hf_pretrain.model.llama import model_parameter_count, tokenizer_size_of
from hf_pretrain.preflight.budget import check_cost
from hf_pretrain.preflight.data import (
    check_batch_split,
    check_context,
    check_data_budget,
    check_data_cache,
    check_loader_pickling,
    check_num_workers,
    check_prepared,
)
from hf_pretrain.preflight.dependencies import check_versions
from hf_pretrain.preflight.disk import (
    check_disk_space,
    check_not_in_use,
    check_output_writable,
    check_save_speed,
)
from hf_pretrain.preflight.gpu import (
    check_bf16,
    check_compiler,
    check_cuda,
    check_fp8,
    check_liger_under_compile,
    check_memory,
    check_tf32,
)
from hf_pretrain.preflight.hub_access import check_hub
from hf_pretrain.preflight.init_from import check_init_from
from hf_pretrain.preflight.lm_eval_tasks import check_lm_eval_tasks
from hf_pretrain.preflight.result import CheckResult, PreflightError, format_table
from hf_pretrain.preflight.resume import check_resume, check_stop_request
from hf_pretrain.preflight.sdpa_kernel import check_attention_backend
from hf_pretrain.preflight.store_access import check_resume_from_store, check_store
from hf_pretrain.preflight.trackers import check_trackers
from hf_pretrain.store.location import Location

__all__ = ["MEMORY_PROBE_ENV", "CheckResult", "PreflightError", "format_table", "preflight", "run_checks"]

# Set ("1") by `hf-pretrain bench` for its short runs: they try the configuration on the device, where
# running out of memory is the answer, so the memory estimate warns instead of refusing.
MEMORY_PROBE_ENV = "HF_PRETRAIN_MEMORY_PROBE"


def _guarded(name: str, check: Callable[[], CheckResult | list[CheckResult]]) -> list[CheckResult]:
    """A check that crashes is reported, not raised: the doctor must never be what kills a run."""
    try:
        result = check()
    except Exception as exc:
        return [
            CheckResult(
                name,
                "warn",
                f"the check could not run: {type(exc).__name__}: {exc}",
                "report this; the run itself may still be fine",
            )
        ]
    return result if isinstance(result, list) else [result]


def run_checks(
    recipe: Recipe,
    resolved: ResolvedRun,
    device_memory_bytes: int | None = None,
    resume_decision: Callable[[], Continuation] | None = None,
) -> list[CheckResult]:
    """Every check, in the order a run meets them: software, GPU, data (and init_from's base model), disk, memory,
    money. `resolved`: the door's answer (training's setup, the doctor's main: profile, world size, places), so no
    row asks which machine this is or where the run lives; `resume_decision`: training's own, else made here once.
    Each row is handed what it checks, and what is worked out once for several (the prepared data's match, the
    model's size, the resume plan); only the cost and init_from rows read the whole recipe."""
    from hf_pretrain.preflight.store_access import data_store_refused

    profile, where, world_size = resolved.profile, resolved.where, resolved.world_size
    unreachable = data_store_refused(where.data)
    if unreachable is not None:  # every data check would retry the store on its own, minutes in all
        return [unreachable]
    # a URL output_dir (the doctor's): the store's rows, the others on the working copy training would use
    url = recipe.train.output_dir if where.run.in_store else None
    if url is not None:
        recipe = recipe.replace(output_dir=str(where.run.local))
    t, saves, speed = recipe.train, recipe.checkpoints, recipe.reporting.expected_tokens_per_s
    # what the memory row and the liger row read of the recipe (each asks of a card: plan's row, gpu_ranking.py)
    sections = {"model": recipe.model, "data": recipe.data, "train": t, "written": recipe.step_as_written}
    parameters = functools.cache(lambda: model_parameter_count(recipe.model, tokenizer_size_of(recipe.data)))
    prepared = functools.cache(lambda: check_prepared_data(recipe, where.data))  # the data rows'
    decision = resume_decision or functools.cache(lambda: decide_resume(recipe, data_identity(where.data)))
    folder_rows = {
        "output_dir": lambda: check_output_writable(t.output_dir),
        "resume": lambda: check_resume(t, saves, decision),
    }
    if url is not None:  # the resume judged on the store's newest train state as this recipe goes on from it
        goes_on = functools.partial(plan_continuation, recipe=recipe, data=data_identity(where.data))
        folder_rows = rows_in_the_store(
            where.run, t, saves, decision, goes_on, recipe.data, parameters=parameters, tokens_per_s=speed
        )
    checks: list[tuple[str, Callable[[], CheckResult | list[CheckResult]]]] = [
        ("versions", lambda: check_versions(recipe.compute, profile)),
        ("trackers", lambda: check_trackers(recipe.reporting)),
        ("lm-eval tasks", lambda: check_lm_eval_tasks(recipe.evaluation)),  # scored at every checkpoint: known before
        ("hub", lambda: check_hub(recipe.publish, output_dir=t.output_dir)),  # push_to_hub: warns, the run trains
        ("cuda", lambda: check_cuda(recipe.compute, profile)),
        ("bf16", lambda: check_bf16(profile)),
        ("fp8", lambda: check_fp8(profile)),
        ("tf32", lambda: check_tf32(recipe.compute, profile)),
        ("attention", lambda: check_attention_backend(recipe.model, profile)),
        ("compiler", lambda: check_compiler(recipe.compute, profile)),
        ("liger + compile", lambda: check_liger_under_compile(**sections, recipe_name=recipe.name)),
        ("data", lambda: check_prepared(recipe.data, recipe.evaluation, prepared)),
        ("data cache", lambda: check_data_cache(recipe.data, where.data, prepared)),
        ("init_from", lambda: check_init_from(recipe, decision, data=where.data)),  # nothing without one
        ("data budget", lambda: check_data_budget(t, recipe.data, recipe.optim, prepared)),
        ("seq_len", lambda: check_context(recipe.data, recipe.model)),
        ("batch", lambda: check_batch_split(t, world_size, seq_len=recipe.data.seq_len)),
        ("num_workers", lambda: check_num_workers(recipe.data)),
        ("loader", lambda: check_loader_pickling(t, recipe.data, where.data)),
        ("output_dir", folder_rows["output_dir"]),
        ("in use", lambda: check_not_in_use(recipe.train.output_dir)),
        ("resume", folder_rows["resume"]),
        ("stop request", lambda: check_stop_request(recipe.train.output_dir, decision)),
        ("disk space", lambda: check_disk_space(t, saves, recipe.data, parameters=parameters())),
        (
            "save speed",
            lambda: check_save_speed(t, saves, recipe.data, parameters=parameters(), expected_tokens_per_s=speed),
        ),
        ("gpu memory", lambda: check_memory(profile, device_memory_bytes, **sections, recipe_name=recipe.name)),
        ("time and cost", lambda: check_cost(recipe, profile.machine.gpu_name, world_size)),
    ]
    results = [result for name, check in checks for result in _guarded(name, check)]
    return _named_as_given(results, recipe.train.output_dir, url)


def _named_as_given(results: list[CheckResult], local: str, url: str | None) -> list[CheckResult]:
    """The rows of a URL run name its URL, not its working copy's folder in the cache (no place the user
    gave): the doctor knows the URL, training finds it in the copy's store.json."""
    from hf_pretrain.run_folder.run_dir import RunDir

    shown = url or RunDir(local).shown_as()
    if not str(local) or str(shown) == str(local):  # "".replace puts `shown` between every character
        return results
    mend = lambda text: text.replace(str(local), str(shown)) if text else text  # noqa: E731
    # the `store cache` row is about the copy's disk itself: there the folder is what the user asked for
    return [
        r if r.name == "store cache" else dataclasses.replace(r, reason=mend(r.reason), fix=mend(r.fix))
        for r in results
    ]


def rows_in_the_store(
    run: Location,
    train: TrainConfig,
    checkpoints: CheckpointConfig,
    decision: Callable[[], Continuation],
    goes_on_from: Callable[[dict], Continuation],
    data: DataConfig,
    *,
    parameters: Callable[[], int],
    tokens_per_s: float,
) -> dict[str, Callable[[], CheckResult | list[CheckResult]]]:
    """The run folder's rows for a run in a store (`run`, the door's; `train`, its working copy's section;
    store_access.py): the store reachable and writable, a checkpoint's upload time and the cache's disk in
    place of the folder's; the resume judged on the store's newest checkpoint where this machine's copy is
    behind it (`goes_on_from`: the recipe's plan from a train state). A checkpoint's size: a model of
    `parameters` with `data`'s tokenizer, saved at `tokens_per_s` (the recipe's expected rate)."""
    return {
        "output_dir": lambda: check_store(
            run, train, checkpoints, data=data, parameters=parameters(), expected_tokens_per_s=tokens_per_s
        ),
        "resume": lambda: check_resume_from_store(run, train, checkpoints, decision, goes_on_from=goes_on_from),
    }


def tried_on_the_device(refusal: CheckResult) -> CheckResult:
    return CheckResult(refusal.name, "warn", f"{refusal.reason}; the bench tries it on the device", refusal.fix)


def preflight(
    recipe: Recipe,
    resolved: ResolvedRun,
    log: Callable[[str], None] = print,
    resume_decision: Callable[[], Continuation] | None = None,
) -> list[CheckResult]:
    """Run every check, log the table, and raise `PreflightError` (the failed checks with their
    fixes) when any fails; returns the results otherwise (warnings included)."""
    results = run_checks(recipe, resolved, resume_decision=resume_decision)
    if os.environ.get(MEMORY_PROBE_ENV) == "1":
        results = [tried_on_the_device(r) if r.name == "gpu memory" and r.status == "fail" else r for r in results]
    log(format_table(results))
    if any(r.status == "fail" for r in results):
        raise PreflightError(results)
    return results
