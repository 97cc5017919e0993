"""The work of `hf-pretrain demo` (publish/demo_command.py reads its flags): a Gradio page that compares
checkpoints of a run, or any models, on one prompt.


    hf-pretrain demo --model runs/smoke                  # every checkpoint of the run, and its final model
    hf-pretrain demo --model runs/1b/final --model TinyLlama/TinyLlama_v1.1 --port 7860

The page lives in hf_pretrain/publish/space_template/app.py, self-contained so that a Space runs it without
hf-pretrain; this module turns run folders and training checkpoints into the page's model choices.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import gradio as gr
from huggingface_hub.utils import HFValidationError, validate_repo_id

from hf_pretrain.checkpoints.layout import MANIFEST, TRAIN_STATE, checkpoint_path
from hf_pretrain.checkpoints.manifest import CheckpointError, verify_checkpoint
from hf_pretrain.checkpoints.store import Checkpoint, list_checkpoints, resolve_checkpoint
from hf_pretrain.config import DEFAULT_PROMPTS
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.publish.export import ExportError, export_checkpoint
from hf_pretrain.publish.space_template.app import (
    DEFAULT_TITLE,
    ModelChoice,
    ModelLibrary,
    build_demo,
    format_progress,
    read_progress,
)
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.store.cache import home


class DemoError(ValueError):
    """A --model that names nothing the demo can offer."""


# ---------------------------------------------------------------------------------- checkpoints
def cached_export(checkpoint: Checkpoint, cache_dir: Path) -> Path:
    """The checkpoint as a standard model folder (hf_pretrain.publish.export, fp32: the weights as trained),
    exported once into `cache_dir`. The folder name carries a hash of the checkpoint's manifest, so a
    checkpoint re-saved at the same step is exported again."""
    digest = hashlib.sha256((checkpoint.path / MANIFEST).read_bytes()).hexdigest()[:16]
    target = cache_dir / f"{checkpoint.path.name}-{digest}"
    if not target.is_dir():  # export builds beside it and renames: present means complete
        # the cache is ours: what a killed export left beside the target goes (overwrite), the modes follow the umask
        export_checkpoint(checkpoint, target, dtype="fp32", overwrite=True)
    return target


def checkpoint_choice(path: Path, name: str, cache_dir: Path) -> ModelChoice:
    checkpoint = resolve_checkpoint(path, checksums=False)  # hashing a 1B model's optimizer state takes minutes
    return ModelChoice(
        name=name,
        source=str(path),
        progress=format_progress(checkpoint.train_state),
        prepare=partial(cached_export, checkpoint, cache_dir),
    )


def run_of(path: Path) -> Path | None:
    """The run folder holding `path`: the run itself, its final/, or one of its checkpoints."""
    for candidate in (path, path.parent, path.parent.parent):
        if RunDir(candidate).resolved_recipe.is_file():
            return candidate
    return None


def model_folder_progress(folder: Path) -> str:
    """From the folder's own files; for a run's final/, else from the run's checkpoint at max_steps:
    train.py always saves one there, holding the very weights final/ was written from."""
    record = read_progress(str(folder))
    run = RunDir(folder.parent)
    recipe = run.load_recipe() if record is None and folder == run.final else None
    if recipe is not None:
        try:
            record = verify_checkpoint(checkpoint_path(run.path, recipe.train.max_steps), checksums=False)
        except CheckpointError:
            pass
    return format_progress(record)


def run_choices(run: Path, cache_dir: Path, log: Callable[[str], None]) -> list[ModelChoice]:
    """Every complete checkpoint, oldest first, then final/ when the run finished."""
    choices = []
    for candidate in reversed(list_checkpoints(run)):
        try:
            choices.append(checkpoint_choice(candidate.path, f"{run.name}/{candidate.path.name}", cache_dir))
        except (CheckpointError, ExportError) as exc:
            log(f"demo: skipping {candidate.path}: {exc}")
    final = RunDir(run).final
    if (final / "config.json").is_file():
        choices.append(ModelChoice(name=f"{run.name}/final", source=str(final), progress=model_folder_progress(final)))
    return choices


# ---------------------------------------------------------------------------------- --model values
def model_choices(spec: str, cache_dir: Path, log: Callable[[str], None] = print) -> list[ModelChoice]:
    """What one --model offers: a run's checkpoints, one checkpoint, a model folder or a Hub repo."""
    path = Path(spec).expanduser()
    if not path.exists():
        try:
            validate_repo_id(spec)
        except HFValidationError as exc:
            raise DemoError(f"--model {spec}: no such folder, and not a Hub repo id either ({exc})") from exc
        log(f"demo: {spec} is not a local folder; it will be loaded from the Hub")
        return [ModelChoice(name=spec, source=spec)]
    if RunDir(path).is_run():
        choices = run_choices(path, cache_dir, log)
        if not choices:
            raise DemoError(f"--model {spec}: the run has no complete checkpoint and no final/ model yet")
        return choices
    if (path / TRAIN_STATE).is_file():
        run = run_of(path)
        name = f"{run.name}/{path.name}" if run else spec
        try:
            return [checkpoint_choice(path, name, cache_dir)]
        except (CheckpointError, ExportError) as exc:
            raise DemoError(f"--model {spec}: {exc}") from exc
    if (path / "config.json").is_file():
        return [ModelChoice(name=spec, source=str(path), progress=model_folder_progress(path))]
    raise DemoError(f"--model {spec}: not a run folder, a checkpoint, or a model folder with config.json")


def milestone_prompts(specs: list[str]) -> list[str]:
    """The example prompts: the runs' `evaluation.prompts` (those sampled during training), else the defaults."""
    prompts: list[str] = []
    for spec in specs:
        run = run_of(Path(spec).expanduser())
        recipe = RunDir(run).load_recipe() if run is not None else None
        if recipe is not None:  # none, or one from an older hf-pretrain: the defaults will do
            prompts += recipe.evaluation.prompts
    return list(dict.fromkeys(prompts)) or list(DEFAULT_PROMPTS)


def _unique(choices: list[ModelChoice]) -> list[ModelChoice]:
    """One entry per source (a checkpoint named alone and through its run), and distinct names."""
    unique, sources, names = [], set(), set()
    for choice in choices:
        if choice.source in sources:
            continue
        base, n = choice.name, 1
        while choice.name in names:
            n += 1
            choice.name = f"{base} ({n})"
        sources.add(choice.source)
        names.add(choice.name)
        unique.append(choice)
    return unique


def build(
    specs: list[str],
    cache_dir: str | Path | None = None,
    title: str = DEFAULT_TITLE,
    log: Callable[[str], None] = print,
) -> gr.Blocks:
    """The page for these --model values (not launched); raises DemoError naming a bad one."""
    cache_dir = Path(cache_dir) if cache_dir else home() / "demo"  # demo_command's default, the user's cache
    choices = _unique([choice for spec in specs for choice in model_choices(spec, cache_dir, log)])
    return build_demo(ModelLibrary(choices), milestone_prompts(specs), title)


def run(args: argparse.Namespace) -> int:
    """The page asked by demo_command's flags (parsed there, without gradio or torch), launched."""
    try:
        demo = build(args.model, args.export_folder, args.title)
    except DemoError as exc:
        print(f"hf-pretrain demo: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0
