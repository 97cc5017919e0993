"""The optional extras of the package (`pip install 'hf-pretrain[eval]'`): what each command needs, and the
one line that says how to install it when it is missing (instead of a ModuleNotFoundError traceback)."""

from __future__ import annotations

import importlib

# extra (pyproject.toml's [project.optional-dependencies]) -> the modules its commands import
EXTRAS = {"eval": ("lm_eval", "evaluate"), "demo": ("gradio",)}


def install_line(extra: str) -> str:
    return f"pip install 'hf-pretrain[{extra}]' (in a clone: pip install -c constraints.txt -e '.[{extra}]')"


def missing_extra(extra: str) -> str | None:
    """None when the extra's modules import; otherwise what is missing and the pip command, in one line.
    Imports them (the command is about to use them): a module that is present but broken counts too."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            absent = exc.name or module
            return f"needs the `{extra}` extra ({absent} is not installed): {install_line(extra)}"
    return None
