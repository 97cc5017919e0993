"""`hf-pretrain` subcommands. Each one is thin: it hands its arguments to one module's `main`, whose
parser is `hf_pretrain.config.CommandParser`, so every command spells and checks its flags the same way."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# command -> (module whose `main(argv) -> int` runs it, one line of help)
COMMANDS = {
    "prepare": (
        "hf_pretrain.data.prepare_command",
        "tokenize the recipe's corpus into shards (fits the tokenizer when asked)",
    ),
    "train": (
        "hf_pretrain.train",
        "train the recipe in this process (`accelerate launch hf_pretrain/train.py` for several)",
    ),
    "launch": (
        "hf_pretrain.engines.launch_command",
        "`accelerate launch ...` that exits with the trainer's own code (0, 75 rerun, 73, 78), for schedulers",
    ),
    "stop": (
        "hf_pretrain.run_commands.stop_command",
        "ask a running job to finish now: decay (wsd), save, write final/",
    ),
    "status": (
        "hf_pretrain.run_commands.run_status",
        "where a run stands: state, step, last checkpoint, loss, stop request",
    ),
    "doctor": ("hf_pretrain.preflight.doctor", "check the plumbing of a run before spending money on it"),
    "export": (
        "hf_pretrain.publish.export_command",
        "write a standard Hugging Face model folder from a checkpoint, optionally push it",
    ),
    "eval": ("hf_pretrain.evaluation.eval_command", "score a model with lm-evaluation-harness"),
    "bench": ("hf_pretrain.bench", "measure tokens/s, MFU, memory and $/token for recipe variants"),
    "check": (
        "hf_pretrain.check",
        "is this pod worth renting for the recipe? five minutes, no data (rent, check, then move in)",
    ),
    "plan": ("hf_pretrain.economics.planning", "tokens, time and cost of a run before it starts"),
    "report": ("hf_pretrain.run_commands.report", "plots and a page for a run folder"),
    "demo": ("hf_pretrain.publish.demo_command", "a Gradio app that compares checkpoints"),
    "space": ("hf_pretrain.publish.space", "write (and push) a Hugging Face Space for the demo"),
    "gguf": ("hf_pretrain.publish.gguf", "write an exported model as a GGUF file for llama.cpp"),
}


def installed(module: str) -> bool:
    """Whether the command's module ships in this install, found without importing anything: finding a
    submodule would run its package's __init__ (torch, transformers: seconds before `--help` answers)."""
    path = Path(__file__).parent.joinpath(*module.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def usage() -> str:
    available = {name: help_ for name, (module, help_) in COMMANDS.items() if installed(module)}
    width = max(map(len, available))
    lines = [f"  {name.ljust(width)}  {help_}" for name, help_ in available.items()]
    return (
        "usage: hf-pretrain <command> [--recipe NAME] [--key value ...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`hf-pretrain <command> --help` lists the command's options, in snake_case like the recipe keys;\n"
        "the kebab-case spelling reads too (`--push-to-hub` is `--push_to_hub`).\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS or not installed(COMMANDS[command][0]):
        print(f"hf-pretrain: unknown command `{command}`\n\n{usage()}", file=sys.stderr)
        return 2
    from hf_pretrain.store.urls import StoreUnavailable, check_command_line

    try:  # a URL typo (`s3:/bkt/x`) would be a local folder named `s3:`: refused for every command
        check_command_line(rest)
    except StoreUnavailable as exc:
        from hf_pretrain.exit_codes import EXIT_CONFIG

        print(f"hf-pretrain {command}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return importlib.import_module(COMMANDS[command][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
