"""The optional extras of the package (`[eval]`, `[demo]`, `[s3]` ...): what each command needs, and the one
line that says how to install it when it is missing (instead of a ModuleNotFoundError traceback).

The pip command is the one that works where the user stands (issue 57: `pip install 'hf-pretrain[s3]'`
fails in a clone, where the package is on no index): in a clone, the clone's own install (`-c
constraints.txt -e '.[s3]'`), with the pip of the environment that runs hf-pretrain (a `.venv` nobody
activated has its pip off the PATH: a bare `pip` would install into another Python).
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import sys
from pathlib import Path

# extra (pyproject.toml's [project.optional-dependencies]) -> the modules its commands import
EXTRAS = {"eval": ("lm_eval", "evaluate"), "demo": ("gradio",)}


def source_tree() -> Path | None:
    """The clone this package runs from (an editable install: pyproject.toml and constraints.txt beside the
    package), else None (an installed wheel: its extras come from an index)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "constraints.txt").is_file() else None


def _as_typed(path: Path, cwd: Path) -> str:
    """`path` as a shell takes it from `cwd`: relative below it (`.venv/bin/pip`), absolute otherwise."""
    try:
        relative = path.absolute().relative_to(cwd.absolute())
    except ValueError:
        return shlex.quote(str(path))
    return shlex.quote(str(relative) if relative.parent != Path(".") else f"./{relative}")


def pip_command(cwd: Path | None = None) -> str:
    """How to call the pip of the Python that runs this: `pip` when that is the one the PATH finds, else its
    path (`.venv/bin/pip` in a venv nobody activated), else `PYTHON -m pip`."""
    cwd = Path.cwd() if cwd is None else cwd
    bin_dir = Path(sys.executable).parent  # not resolved: a venv's python is a link to the base one
    ours = bin_dir / "pip"
    on_path = shutil.which("pip")
    if on_path and ours.is_file() and os.path.samefile(on_path, ours):
        return "pip"
    if ours.is_file():
        return _as_typed(ours, cwd)
    return f"{_as_typed(Path(sys.executable), cwd)} -m pip"


def install_line(extra: str, cwd: Path | None = None) -> str:
    """The command that installs `extra` into the environment that runs hf-pretrain, as it works pasted in
    `cwd` (the working directory): the clone's own install in a clone, the index's otherwise."""
    cwd = Path.cwd() if cwd is None else cwd
    pip, clone = pip_command(cwd), source_tree()
    if clone is None:
        return f"{pip} install 'hf-pretrain[{extra}]'"
    here = clone == cwd.resolve()  # from elsewhere the clone's files are named by their path
    constraints = "constraints.txt" if here else str(clone / "constraints.txt")
    target = "." if here else str(clone)
    return f"{pip} install -c {shlex.quote(constraints)} -e {shlex.quote(f'{target}[{extra}]')}"


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
