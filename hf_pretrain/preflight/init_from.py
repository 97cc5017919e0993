"""The base model of a continued pretraining (`init_from`): it can be had, it is a Llama, its config.json
agrees with the recipe's model keys, and the data was tokenized with its tokenizer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.resume_decision import decide_resume
from hf_pretrain.checkpoints.resume_plan import Continuation, ResumeRefused
from hf_pretrain.config import Recipe
from hf_pretrain.data.prepared import data_identity, reprepare_hint
from hf_pretrain.data.tokenizer import TokenizerError, local_data_folder
from hf_pretrain.model.initialisation import (
    InitFromError,
    beyond_the_recipe,
    data_tokenizer_differs,
    open_base,
    recipe_differences,
    weight_files,
)
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.store.location import Location

NAME = "init_from"


def check_init_from(
    recipe: Recipe, resume_decision: Callable[[], Continuation] | None = None, *, data: Location
) -> list[CheckResult]:
    """Nothing for a run from random weights; a skip for a run that goes on from its own checkpoint (the
    base is not read again: `resume_decision` is the resume check's, made here when not given); otherwise whether the base model
    can start this run. `data`: where the data lives (the door's `Where`)."""
    init_from = recipe.model.init_from
    if not init_from:
        return []
    saved = _saved_checkpoint(resume_decision or (lambda: decide_resume(recipe, data_identity(data))))
    if saved is not None:
        return [
            CheckResult(
                NAME, "skip", f"the run goes on from its checkpoint of step {saved['step']:,}: {init_from} is not read"
            )
        ]
    try:
        base = open_base(init_from)
        if base.folder.is_dir() and any(base.folder.glob("*.safetensors")):  # a Hub id's weights come at training
            weight_files(base)  # every file's header, and that the file holds all its tensors' bytes
    except InitFromError as exc:
        return [CheckResult(NAME, "fail", exc.reason, exc.fix)]
    differences = recipe_differences(base.config, recipe.model, recipe.data)
    if differences:
        return [_model_keys_differ(init_from, differences)]
    data_dir = recipe.data.data_dir
    try:
        tokenizers = data_tokenizer_differs(base, local_data_folder(data))
    except InitFromError as exc:
        return [CheckResult(NAME, "fail", exc.reason, exc.fix)]
    except (FileNotFoundError, TokenizerError):  # no prepared data: the data check says so
        tokenizers, data_note = None, f"{data_dir} holds no tokenizer to compare with yet"
    else:
        data_note = f"{data_dir} is tokenized with its tokenizer"
    if tokenizers is not None:
        with_its_tokenizer = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, tokenizer=init_from))
        return [
            _data_tokenized_otherwise(init_from, data_dir, tokenizers, fix=reprepare_hint(with_its_tokenizer, data))
        ]
    kept = beyond_the_recipe(base.config)
    return [
        CheckResult(
            NAME,
            "pass",
            f"{init_from} ({base.folder}): a Llama whose config.json agrees with the recipe's model keys; "
            f"{data_note}" + (f"; also from config.json: {', '.join(kept)}" if kept else ""),
        )
    ]


def _saved_checkpoint(resume_decision: Callable[[], Continuation]) -> dict[str, Any] | None:
    """The run's own checkpoint it goes on from, if any (then the base model is not read again)."""
    try:
        return resume_decision().saved
    except (ResumeRefused, CheckpointError):
        return None  # the resume check says why; the base is checked as for a start


def _model_keys_differ(init_from: str, differences: dict[str, tuple[Any, Any]]) -> CheckResult:
    """The base model's config.json and the recipe's model keys disagree: each key, and the flags that agree."""
    return CheckResult(
        NAME,
        "fail",
        f"{init_from}'s config.json and the recipe's model keys differ: "
        + ", ".join(
            f"{key} {ours} in the recipe, {theirs} in config.json" for key, (ours, theirs) in differences.items()
        ),
        "set them to the base model's in the recipe, or pass "
        + " ".join(f"--{key} {theirs}" for key, (_, theirs) in differences.items()),
    )


def _data_tokenized_otherwise(init_from: str, data_dir: str, tokenizers: tuple[str, str], *, fix: str) -> CheckResult:
    """data_dir holds tokens of another tokenizer than the base model's: `fix`, a prepare with its own, fixes it."""
    return CheckResult(
        NAME,
        "fail",
        f"data_dir {data_dir} was tokenized with another tokenizer than {init_from}'s (tokenizer hash "
        f"{tokenizers[0][:12]} there, {tokenizers[1][:12]} for the base model): the model would read "
        f"other tokens than it learned",
        f"with its tokenizer, {fix}",
    )
