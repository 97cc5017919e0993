"""Each part of the check in its own process, under its own limit: a part that overruns is killed with
everything it started (its own process group) and the check says so in one line and goes on, keeping
what the part measured before (figures.py writes figure by figure). A fresh process per part also gives
each its whole device: one part's allocator cache or compiled graphs do not weigh on the next."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def finished(context_file: Path) -> Path:
    """The file a part's process writes when it has measured and said everything (worker.py)."""
    return context_file.with_suffix(".done")


def run_part(part: str, context: dict[str, Any], folder: Path, limit_s: float, say=print, label: str = "") -> str:
    """Run `part` (check/worker.py) with `context` in a child process for at most `limit_s` seconds:
    "done", "cut" (killed at its limit) or "failed (exit N)". Its screen lines pass through as they come;
    `label` names the run in the lines said here (a step variant)."""
    name = f"{part} ({label})" if label else part
    folder.mkdir(parents=True, exist_ok=True)
    context_file = folder / f"{part}.{context.get('item_index', 0)}.json"
    context_file.write_text(json.dumps(context))
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    command = [sys.executable, "-m", "hf_pretrain.check.worker", part, str(context_file)]
    started = time.monotonic()
    # its own session: the kill at the limit reaches the processes it started too (a probe, the ranks)
    child = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = child.wait(timeout=max(limit_s, 0.1))
    except KeyboardInterrupt:  # its own session got no SIGINT: end it and what it started, then pass it on
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        if finished(context_file).exists():  # it had said everything and was only exiting (a loaded CPU)
            return "done"
        say(f"  {name}: cut at its limit of {limit_s:.0f} s; what it measured before is kept")
        return "cut"
    if code != 0:
        say(f"  {name}: failed (exit {code}) after {time.monotonic() - started:.0f} s; see the lines above")
        return f"failed (exit {code})"
    return "done"
