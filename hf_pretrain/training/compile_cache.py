"""Compiled code that travels with the run: torch's compile artifacts saved in the run folder, loaded by
the next session before its first step.

A relaunch on a fresh machine pays torch.compile again (the smoke recipe on 2 cores: ~50 s of a ~64 s
first step); torch can carry the result from one machine to the next (`torch.compiler.save_cache_artifacts`
/ `load_cache_artifacts`, the "mega-cache" of AOTAutograd's and inductor's graphs and kernels), valid
for the same torch and the same kind of device. So:

- After the session's first compiled step (and again whenever later steps compiled something new: the
  evaluation's no-grad graph), the main process writes `compile_cache/<key>.bin` with `<key>.json`
  beside it (what the key is made of, the bytes' size and sha256), each through a temporary file and a
  rename. A run URL's copy goes to the store with the run's records (store/run/uploader.py), each file
  once (they are megabytes, and unchanged between heartbeats), and comes back at a pull (store/run/pull.py).
- At the start, before the first step, every process loads the file of its key, said in one line. Files
  of another key (another torch, another card, another model shape or compile setting) and a file that
  does not load are ignored with a line, never a crash: the run compiles as it would have anyway.

The key is what makes the artifacts valid, read from what the run resolved: torch's version, the device
(CUDA's name of the card, or "cpu"), the model's shape and the step's settings (run_profile.Step: precision,
compile_regions, micro batch, recomputed layers, attention kernel, processes ...) and the sequence length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hf_pretrain.config.model_section import SHAPE_KEYS
from hf_pretrain.run_folder.sessions import start_up

FOLDER = "compile_cache"  # in the run folder, beside checkpoints/
# The model config's fields that shape the compiled graphs: the weights' shapes (the model section's own list),
# and what the graphs compute with beyond them
MODEL_FIELDS = (*SHAPE_KEYS, "max_position_embeddings", "rms_norm_eps", "rope_theta", "torch_dtype")


def key_fields(profile, model_config, seq_len: int) -> dict[str, Any]:
    """What the artifacts of a run are valid for: `profile` a machine/run_profile.RunProfile, `model_config`
    the Llama config the run built. JSON-ready."""
    machine = profile.machine
    config = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    return {
        "torch": torch.__version__,
        "device": (machine.name or "cuda") if machine.on_gpu else machine.kind,
        "model": {name: _plain(config.get(name)) for name in MODEL_FIELDS},
        "step": {k: _plain(v) for k, v in dataclasses.asdict(profile.step).items()},
        "seq_len": seq_len,
    }


def cache_key(fields: dict[str, Any]) -> str:
    """A short name for `fields`: the same fields, the same key, on any machine."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What sets `theirs` apart from `mine`, in words: torch's version and the device by value, the rest by name."""
    said = []
    for name in ("torch", "device"):
        if mine.get(name) != theirs.get(name):
            said.append(f"{name} {theirs.get(name)} there, {mine.get(name)} here")
    for name in ("model", "step", "seq_len"):
        if mine.get(name) != theirs.get(name):
            if isinstance(mine.get(name), dict) and isinstance(theirs.get(name), dict):
                keys = sorted(
                    k for k in mine[name].keys() | theirs[name].keys() if mine[name].get(k) != theirs[name].get(k)
                )
                said.append(f"{name} ({', '.join(keys)})")
            else:
                said.append(name)
    return "; ".join(said) or "another key"


@contextmanager
def _torch_quiet() -> Any:
    """torch logs a failed un-pickling as a warning with its traceback: the line said here is the whole story."""
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _artifacts(info: Any) -> set[tuple[str, str]]:
    """(kind, key) of each artifact a torch CacheInfo names."""
    return {(kind, str(key)) for kind, keys in (getattr(info, "artifacts", None) or {}).items() for key in keys}


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a reader sees the old file or the whole new one, never half of it


class CompileCache:
    """The run's compile artifacts for this session: `load()` before the first step (every process),
    `due()` / `save()` after each step (the main process writes; `due` is cheap)."""

    def __init__(
        self,
        run_folder: str | os.PathLike,
        fields: dict[str, Any],
        *,
        compiled: bool,
        main: bool,
        say: Callable[[str], None] = print,
        shown: Callable[[str], str] = lambda text: text,
    ):
        self.folder = Path(run_folder) / FOLDER
        self.fields, self.key = fields, cache_key(fields)
        self.compiled, self.main, self.say, self.shown = compiled, main, say, shown
        self.have: set[tuple[str, str]] = set()  # the artifacts the file holds (loaded or saved): not written again
        self.saves = 0

    @classmethod
    def loaded(cls, run_dir, key: dict, compute, accelerator) -> CompileCache:
        """The run folder's cache for `key`, its artifacts loaded where an earlier session saved them (`compute`:
        the recipe's compute section, whether the step compiles; the main process saves, every one loads)."""
        cache = cls(
            run_dir.path,
            key,
            compiled=compute.compile,
            main=accelerator.is_main_process,
            say=accelerator.print,
            shown=run_dir.in_words,
        )
        cache.load()
        return cache

    @property
    def bin(self) -> Path:
        return self.folder / f"{self.key}.bin"

    @property
    def meta(self) -> Path:
        return self.folder / f"{self.key}.json"

    # ------------------------------------------------------------------ at the start
    def load(self) -> bool:
        """This key's artifacts into torch's caches, said in a line; True when they loaded."""
        if not self.compiled:
            return False
        with start_up.timed("compile_cache"):  # sessions.jsonl: what the start-up went to
            line, ok = self._load()
        if line:
            self.say(line)
        return ok

    def _load(self) -> tuple[str | None, bool]:
        if not self.bin.is_file():
            others = self._other_keys()
            if not others:
                return f"compile cache: none saved for this setup yet (key {self.key}): compiling from scratch", False
            theirs = json.loads(others[0].read_text()).get("fields") or {}
            return (
                f"compile cache: ignored {len(others)} set(s) of compiled kernels saved for another setup "
                f"({differences(self.fields, theirs)}): compiling from scratch (key {self.key})",
                False,
            )
        where = self.shown(str(self.bin))
        try:
            data = self.bin.read_bytes()
            meta = json.loads(self.meta.read_text()) if self.meta.is_file() else {}
        except (OSError, ValueError) as exc:
            return f"compile cache: ignored {where}: it could not be read ({exc}): compiling from scratch", False
        if meta.get("sha256") and meta["sha256"] != hashlib.sha256(data).hexdigest():
            return f"compile cache: ignored {where}: its bytes fail their checksum: compiling from scratch", False
        try:
            with _torch_quiet():
                info = torch.compiler.load_cache_artifacts(data)
        except Exception as exc:  # whatever a foreign or damaged file raises: the run compiles as it would anyway
            return (
                f"compile cache: ignored {where}: it does not load ({type(exc).__name__}: {str(exc)[:120]}): "
                "compiling from scratch",
                False,
            )
        if info is None:
            return f"compile cache: ignored {where}: torch could not read it: compiling from scratch", False
        self.have = _artifacts(info)
        by = f"an earlier session ({meta['saved']})" if meta.get("saved") else "an earlier session"
        return (
            f"compile cache: loaded {_mb(len(data))} of compiled kernels saved by {by} "
            f"(key {self.key}: torch {self.fields['torch']}, {self.fields['device']})",
            True,
        )

    def _other_keys(self) -> list[Path]:
        try:
            return sorted(p for p in self.folder.glob("*.json") if p.stem != self.key)
        except OSError:
            return []

    # ------------------------------------------------------------------ after a step
    def due(self) -> bool:
        """Whether there is something new to save: the session's first compiled step, then any step that
        compiled something more (torch's own count of artifacts not serialized yet)."""
        if not (self.compiled and self.main):
            return False
        if self.saves == 0:
            return True
        try:
            from torch.compiler._cache import CacheArtifactManager

            return CacheArtifactManager.need_serialize()
        except (ImportError, AttributeError):  # another torch: the first save alone
            return False

    def save(self, step: int) -> None:
        """Every artifact this process compiled or loaded so far into this key's file (a warning, never a
        crash, when it cannot be written); unchanged bytes are not written again."""
        self.saves += 1
        try:
            saved = torch.compiler.save_cache_artifacts()
        except Exception as exc:
            self.say(f"warning: compile cache: torch could not serialize its artifacts ({type(exc).__name__}: {exc})")
            return
        if saved is None or _artifacts(saved[1]) <= self.have:  # a loaded file's hits are no news
            return
        data, info = saved
        meta = {
            "key": self.key,
            "fields": self.fields,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": step,
            "artifacts": {kind: len(items) for kind, items in (getattr(info, "artifacts", None) or {}).items()},
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_atomically(self.bin, data)
            _write_atomically(self.meta, (json.dumps(meta, indent=1) + "\n").encode())  # last: the file is whole
        except OSError as exc:
            self.say(f"warning: compile cache: {self.shown(str(self.bin))} could not be written: {exc.strerror or exc}")
            return
        self.have = _artifacts(info)
        self.say(
            f"compile cache: saved {_mb(len(data))} of compiled kernels after step {step} to "
            f"{self.shown(str(self.bin))}: the next session loads them instead of compiling"
        )
