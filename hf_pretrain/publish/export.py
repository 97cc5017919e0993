"""The work of `hf-pretrain export` (publish/export_command.py reads its flags): a standard Hugging Face
model folder from a training checkpoint, optionally pushed (the command lines: its docstring).

The folder holds safetensors weights, `config.json`, `generation_config.json`, a tokenizer that
current and older transformers both load as a plain fast tokenizer, a model card (`README.md`) and
the loss curve it shows. Plain checkpoints and FSDP sharded ones (`pytorch_model_fsdp_0/`) work alike.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoTokenizer, GenerationConfig

from hf_pretrain.checkpoints.layout import WEIGHTS
from hf_pretrain.checkpoints.load import load_checkpoint_model
from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.store import Checkpoint, resolve_checkpoint
from hf_pretrain.data.tokenizer import MODEL_INPUT_NAMES
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_WRITE_FAILED
from hf_pretrain.formatting import human_bytes
from hf_pretrain.publish.formats import DTYPE_NAMES
from hf_pretrain.publish.gguf import GGUFError, GGUFWriteError, write_gguf
from hf_pretrain.publish.hub import push_folder, push_or_explain
from hf_pretrain.publish.model_card import LOSS_CURVE, CardOptions, write_model_card
from hf_pretrain.publish.targets import unwritable_reason
from hf_pretrain.store.location import Location
from hf_pretrain.store.reach import StoreRefused
from hf_pretrain.store.run.reading import readable

DTYPES = dict(zip(DTYPE_NAMES, (torch.bfloat16, torch.float16, torch.float32), strict=True))
# What an export folder holds: the files `export_checkpoint` writes, sharded weights, a GGUF (`--gguf`), and
# what a Hub clone or push leaves. `--overwrite` replaces a folder holding nothing else.
EXPORT_FILES = {
    WEIGHTS,
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "README.md",
    LOSS_CURVE,
    ".gitattributes",
}
EXPORT_PATTERNS = ("model-*-of-*.safetensors", "*.gguf", "*.gguf.tmp")
# What an interrupted export leaves (a kill, a full disk): a GGUF file being written inside the folder, and
# the hidden folders an export builds in and moves a previous export to, beside it. `--overwrite` removes them.
LEFTOVERS_INSIDE = "*.gguf.tmp"
LEFTOVERS_BESIDE = (".{name}.export-*", ".{name}.previous-*")
EXPORT_FOLDERS = {".cache"}  # huggingface_hub's metadata of a local folder it uploaded or downloaded


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported, with the reason."""


class ExportWriteError(ExportError):
    """The disk refused the export (full, quota, I/O error); nothing of it was left behind."""


def leftovers(out: Path) -> list[Path]:
    """Files and folders an interrupted export to `out` left behind."""
    target = out.resolve()
    found = sorted(target.glob(LEFTOVERS_INSIDE)) if target.is_dir() else []
    for pattern in LEFTOVERS_BESIDE:
        found += sorted(p for p in target.parent.glob(pattern.format(name=target.name)) if p.is_dir())
    return found


def remove_leftovers(out: Path, log: Callable[[str], None] = print) -> None:
    found = leftovers(out)
    for path in found:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if found:
        log(f"export: removed what an interrupted export left: {', '.join(map(str, found))}")


def publishable(folder: Path) -> None:
    """Modes for a folder others read (a container serving it, another user): what the umask gives a new
    file or folder (0644 / 0755 under the usual 022), not mkdtemp's 0700 or a temporary file's 0600."""
    mask = _umask()
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (other threads keep creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_failure(exc: BaseException, target: Path) -> ExportWriteError:
    """A failed write in a line: what the disk said, where, and how much room is left."""
    where = Path(exc.filename) if isinstance(exc, OSError) and exc.filename else target
    said = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    try:
        free = f"{human_bytes(shutil.disk_usage(target.parent).free)} free on {target.parent}"
    except OSError:
        free = f"{target.parent} cannot be read"
    return ExportWriteError(
        f"writing {where} failed: {said}; {free}. Nothing of this export was left behind: free space or "
        f"choose another --out, then export again"
    )


def save_plain_fast_tokenizer(tokenizer, folder: Path, model_max_length: int) -> None:
    """tokenizer.json plus a `PreTrainedTokenizerFast` tokenizer_config.json and special_tokens_map.json:
    what transformers 4 and 5, and loaders that expect a plain fast tokenizer, all read the same way."""
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    special = {key: str(value) for key, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.added_tokens_decoder.items())
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "added_tokens_decoder": added,
        "model_input_names": MODEL_INPUT_NAMES,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")


def add_transformers4_config_keys(config_file: Path) -> None:
    """Also write the keys transformers 4.x reads for a Llama: v5 keeps RoPE in `rope_parameters`,
    which 4.57 ignores, silently falling back to theta 10000 (different logits, no warning)."""
    config = json.loads(config_file.read_text())
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", rope)
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def is_export_entry(path: Path) -> bool:
    """Whether `path`, in an export folder, is something an export (or its push, or `--gguf`) wrote."""
    if path.is_dir():
        return path.name in EXPORT_FOLDERS
    return path.name in EXPORT_FILES or any(fnmatch.fnmatch(path.name, pattern) for pattern in EXPORT_PATTERNS)


def check_replaceable(out: Path, checkpoint: Path, overwrite: bool) -> None:
    """Raise unless `out` is absent, empty, or (with `overwrite`) a previous export and nothing more:
    `--overwrite` must never delete a user's own files, a run folder or the checkpoint being exported."""
    if not out.exists():
        stale = leftovers(out)
        if stale and not overwrite:
            raise ExportError(
                f"an interrupted export to {out} (a kill, a full disk) left {', '.join(map(str, stale))}; "
                f"--overwrite removes them (or delete them yourself; if another export to {out} is running, "
                f"wait for it)"
            )
        return
    if not out.is_dir():
        raise ExportError(f"{out} is a file, not a folder; choose another --out")
    entries = sorted(out.iterdir())
    if not entries:
        return
    if not overwrite:
        stale = leftovers(out)
        named = f" (with {', '.join(p.name for p in stale)}, left by an interrupted export)" if stale else ""
        raise ExportError(
            f"{out} already exists and is not empty{named}; pass --overwrite to replace a previous export"
        )
    if checkpoint.resolve().is_relative_to(out.resolve()):
        raise ExportError(
            f"--out {out} holds the checkpoint being exported ({checkpoint}); --overwrite would delete "
            f"it. Choose another --out"
        )
    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries if not is_export_entry(p)]
    if foreign or not (out / "config.json").is_file():
        listed = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise ExportError(
            f"--overwrite replaces only a previous export, and {out} is not one: it also holds "
            f"{listed or 'no config.json'}. Choose another --out, or move those away yourself"
        )


def export_checkpoint(
    checkpoint: Checkpoint,
    out: str | Path,
    dtype: str = "bf16",
    card: CardOptions | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Write the model folder for `checkpoint` to `out`, whole or not at all (built beside it, then
    renamed); `overwrite` replaces a previous export there, and nothing else (`check_replaceable`), and
    removes what an interrupted one left. A write the disk refuses raises `ExportWriteError`."""
    out = Path(out)
    check_replaceable(out, checkpoint.path, overwrite)
    unwritable = unwritable_reason(out.absolute().parent)
    if unwritable:
        raise ExportError(f"cannot write {out}: {unwritable}; choose an --out on a writable disk")
    if overwrite:
        remove_leftovers(out, log)
    target = out.resolve()  # `--out .` has no name to build beside
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.path, local_files_only=True)
    model = load_checkpoint_model(checkpoint.path, DTYPES[dtype])
    # Generation stops at the tokenizer's end-of-text and pads with its pad token, not at hard-coded ids.
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    }
    for key, value in ids.items():
        setattr(model.config, key, value)
    model.generation_config = GenerationConfig(**ids)

    target.parent.mkdir(parents=True, exist_ok=True)
    # built in a fresh hidden folder beside the target: no name of the user's is ever reused or removed
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        try:
            model.save_pretrained(building)
            add_transformers4_config_keys(building / "config.json")
            save_plain_fast_tokenizer(tokenizer, building, model.config.max_position_embeddings)
            write_model_card(
                building, checkpoint.train_state, checkpoint.run_dir, model, card or CardOptions(target.name)
            )
            publishable(building)
        except (OSError, SafetensorError) as exc:  # a full disk, a quota: said in a line, the folder removed below
            raise write_failure(exc, target) from exc
        if target == Path.cwd().resolve():  # `--out .`: the shell stays in this folder, so fill it in place
            for old in target.iterdir():  # a previous export (checked above)
                shutil.rmtree(old) if old.is_dir() else old.unlink()
            for new in building.iterdir():
                os.replace(new, target / new.name)
        elif target.exists():  # a previous export (checked above), or an empty folder
            previous = Path(tempfile.mkdtemp(prefix=f".{target.name}.previous-", dir=target.parent))
            os.replace(target, previous)  # onto the empty folder mkdtemp made
            os.replace(building, target)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.replace(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already unless something failed
    return out


def push_checkpoint(checkpoint_dir: str | Path, repo_id: str, step: int, private: bool = False) -> str:
    """Export `checkpoint_dir` (bf16) and push it to branch `step-{step}` of `repo_id`; returns the
    commit URL. For the training loop: call it on the main process only; it raises `HubError`."""
    checkpoint = resolve_checkpoint(checkpoint_dir, checksums=False)  # just written by us: skip the hashing
    with tempfile.TemporaryDirectory() as scratch:
        folder = export_checkpoint(
            checkpoint, Path(scratch) / repo_id.split("/")[-1], card=CardOptions(model_name=repo_id, repo_id=repo_id)
        )
        return push_folder(
            folder, repo_id, private=private, revision=f"step-{step}", commit_message=f"Checkpoint at step {step}"
        )


def run(args: argparse.Namespace) -> int:
    """The export asked by export_command's flags (parsed there, without torch)."""

    options = CardOptions(
        model_name=args.push_to_hub or Path(args.out).resolve().name,
        license=args.license,
        hardware=args.hardware,
        price_per_hour=args.price_per_hour,
        repo_id=args.push_to_hub,
        local_path=args.out,
    )
    try:
        # a URL: its newest complete checkpoint (or the one it names) pulled into the cache first
        local = readable(Location.of(args.checkpoint), say=lambda line: print(f"export: {line}"))
        checkpoint = resolve_checkpoint(local, log=lambda reason: print(f"export: {reason}"))
        shown = str(checkpoint.path).replace(str(local), str(args.checkpoint).rstrip("/"), 1)  # a URL: as given
        print(f"export: {shown} (step {checkpoint.train_state.get('step')}) -> {args.out} [{args.dtype}]")
        out = export_checkpoint(checkpoint, args.out, args.dtype, options, args.overwrite)
    except (CheckpointError, ExportError, StoreRefused) as exc:
        print(f"hf-pretrain export: error: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED if isinstance(exc, ExportWriteError) else EXIT_CONFIG
    print(f"export: wrote {out}")
    if args.gguf:
        try:
            print(f"export: wrote {write_gguf(out, gguf_type=args.gguf_type, overwrite=True)}")
        except GGUFError as exc:
            print(f"hf-pretrain export: error: {exc} (the HF folder {out} is complete)", file=sys.stderr)
            return EXIT_WRITE_FAILED if isinstance(exc, GGUFWriteError) else EXIT_CONFIG
    if args.push_to_hub:
        url = push_or_explain(
            out,
            args.push_to_hub,
            prog="hf-pretrain export",
            what="export",
            rerun_hint=", or rerun this command with --overwrite",
            private=args.private,
            revision=args.revision,
        )
        if url is None:
            return EXIT_FAILED
        print(f"export: pushed to {url}")
    return 0
