"""The side jobs of a training run: publish and score its checkpoints without holding it up.

`hf_pretrain/train.py` hands `SideJobs(recipe.publish, recipe.evaluation)` to the loop, which calls it on
the main process only (training/callbacks.py):

- each saved checkpoint, with `push_checkpoints`: exported (bf16) and pushed to branch `step-N`
  of `push_to_hub`, on a background thread (one upload at a time, in order);
- each saved checkpoint, with `lm_eval_tasks`: scored with lm-eval in a subprocess
  (`python -m hf_pretrain.evaluation.score_checkpoint ...`), which appends its record to the run's
  benchmarks.jsonl when it is ready;
- at the end of the schedule: `final/`, the last checkpoint exported in `FINAL_DTYPE` (the size
  the disk check counts), then pushed to `main` of `push_to_hub` in the background.

A job reads a pinned copy of its checkpoint (hard links), so pruning cannot pull it away while the
run goes on. A failure only warns: a push or a benchmark is never a reason to lose the run. At its
end the run waits for what is still pending, and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from hf_pretrain.checkpoints.layout import MANIFEST, TRAIN_STATE, TRAINING_ONLY_PREFIXES
from hf_pretrain.checkpoints.progress import FolderBytes, LiveLine
from hf_pretrain.checkpoints.store import pin_checkpoint, resolve_checkpoint
from hf_pretrain.config import EvaluationConfig, PublishConfig
from hf_pretrain.publish.export import export_checkpoint, push_checkpoint
from hf_pretrain.publish.hub import HubError, push_folder
from hf_pretrain.publish.model_card import CardOptions
from hf_pretrain.run_folder.run_dir import FINAL_DTYPE, RunDir


def final_bytes(checkpoint: Path) -> int:
    """About what final/ takes: the checkpoint's files an export keeps (weights in fp32, as final/ has them,
    config, tokenizer); its card and plot come on top. 0 under FSDP (sharded weights: no total)."""
    kept = [
        f
        for f in checkpoint.iterdir()
        if f.is_file() and f.name not in (MANIFEST, TRAIN_STATE) and not f.name.startswith(TRAINING_ONLY_PREFIXES)
    ]
    return sum(f.stat().st_size for f in kept) if any(f.suffix == ".safetensors" for f in kept) else 0


class SideJobs:  # a training.callbacks.Callback
    """The recipe's publishing and benchmark jobs, built from the `publish:` and `evaluation:` sections;
    `log` says what they did (from any thread)."""

    def __init__(self, publish: PublishConfig, evaluation: EvaluationConfig, *, log: Callable[[str], None] = print):
        self.publish, self.evaluation, self.log = publish, evaluation, log
        self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-pretrain-upload")
        self._benchmarks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-pretrain-benchmark")
        self._pending: list[tuple[str, Future]] = []
        self.not_pushed: list[tuple[str, str]] = []  # (what, why): said again at the end of the run

    def on_checkpoint_saved(self, path: Path, step: int) -> None:
        jobs = []
        if self.publish.push_checkpoints:
            jobs.append((f"the push of step {step}", self._uploads, self._push_checkpoint))
        if self.evaluation.lm_eval_tasks:
            jobs.append((f"the benchmarks of step {step}", self._benchmarks, self._benchmark))
        if not jobs:
            return
        pin = _Pin(pin_checkpoint(path), users=len(jobs))
        for name, worker, job in jobs:
            self._pending.append((name, worker.submit(self._run, name, job, pin, step)))

    def on_train_end(self, run: RunDir) -> None:
        """`final/`: a standard Hugging Face folder with its model card, by the same code path as
        `hf-pretrain export` (FSDP shards are merged too). Written before the run returns."""
        newest = resolve_checkpoint(run.path, checksums=False, log=self.log)  # the one this run just saved
        building = FolderBytes(run.path, f".{run.final.name}.export-*", final_bytes(newest.path))
        with LiveLine(f"writing {run.final.name}/", building, self.log):  # export builds it beside, then renames
            export_checkpoint(
                newest,
                run.final,
                dtype=FINAL_DTYPE,
                overwrite=True,
                card=CardOptions(
                    model_name=self.publish.push_to_hub or run.path.name,
                    repo_id=self.publish.push_to_hub or None,
                    local_path=str(run.final),
                ),
            )
        if self.publish.push_to_hub:
            self._pending.append(("the push of final/", self._uploads.submit(self._push_final, run)))

    def wait(self) -> None:
        pending = [name for name, future in self._pending if not future.done()]
        if pending:
            self.log(f"waiting for {len(pending)} side job(s) to finish: {', '.join(pending)}")
        for _, future in self._pending:
            future.result()  # the jobs catch their own failures
        self._pending.clear()

    # ------------------------------------------------------------------ the jobs (background threads)
    def _run(self, name: str, job: Callable[[Path, int], None], pin: _Pin, step: int) -> None:
        try:
            job(pin.path, step)
        except Exception as exc:  # a side job is a service to the run, never a reason to lose it
            self.log(f"warning: {name} failed: {type(exc).__name__}: {exc}")
            if job == self._push_checkpoint:
                self.not_pushed.append((f"branch step-{step}", f"{type(exc).__name__}: {exc}"))
        finally:
            pin.release()

    def _push_checkpoint(self, checkpoint: Path, step: int) -> None:
        try:
            url = push_checkpoint(checkpoint, self.publish.push_to_hub, step, private=self.publish.push_private)
        except HubError as exc:
            self.log(f"warning: step {step} was not pushed: {exc}")
            self.not_pushed.append((f"branch step-{step}", str(exc)))
            return
        self.log(f"step {step}: pushed to {url}")

    def _benchmark(self, checkpoint: Path, step: int) -> None:
        command = [
            sys.executable,
            "-m",
            "hf_pretrain.evaluation.score_checkpoint",  # run, never imported: publish/ stays above evaluation/
            str(checkpoint),
            "--tasks",
            ",".join(self.evaluation.lm_eval_tasks),
            "--limit",
            str(self.evaluation.lm_eval_limit),
        ]
        if self.evaluation.lm_eval_data_dir:
            command += ["--data_dir", self.evaluation.lm_eval_data_dir]
        # lm-eval loads its own copy of the model: in its own process it shares no memory, lock or
        # RNG with training, and ends by giving all of it back
        result = subprocess.run(command, capture_output=True, text=True)
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            reason = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
            self.log(f"warning: step {step} benchmarks failed: {reason}")
            return
        self.log(f"step {step}: benchmarks {json.loads(lines[-1])['tasks']}")

    def _push_final(self, run: RunDir) -> None:
        try:
            self.log(
                f"pushed final/ to {push_folder(run.final, self.publish.push_to_hub, private=self.publish.push_private)}"
            )
        except HubError as exc:
            self.log(f"warning: {exc}; push it later with `{self._upload_final(run)}`")
            self.not_pushed.append(("final/", str(exc)))

    def _upload_final(self, run: RunDir) -> str:
        return f"hf upload {self.publish.push_to_hub} {run.final}" + (" --private" if self.publish.push_private else "")

    def unpushed(self, run: RunDir) -> str | None:
        """After `wait`: a line naming what was not pushed, why (the first reason) and how to push it, or None."""
        if not self.not_pushed:
            return None
        what = ", ".join(name for name, _ in self.not_pushed)
        fixes = []
        if any(name == "final/" for name, _ in self.not_pushed):
            fixes.append(f"`{self._upload_final(run)}`")
        newest_branch = next((n for n, _ in reversed(self.not_pushed) if n.startswith("branch step-")), None)
        if newest_branch is not None:
            step = int(newest_branch.removeprefix("branch step-"))
            folder = run.checkpoints / f"step_{step:08d}"
            if folder.is_dir():  # the others may have been pruned since
                fixes.append(
                    f"`hf-pretrain export --checkpoint {folder} --out {run.path / 'exports' / f'step-{step}'} "
                    f"--push_to_hub {self.publish.push_to_hub} --revision step-{step}`"
                )
        how = f"; push later with {' and '.join(fixes)}" if fixes else ""
        return f"not pushed to {self.publish.push_to_hub}: {what} ({self.not_pushed[0][1]}){how}"


class _Pin:
    """A pinned checkpoint shared by the jobs of one save; the last of them to finish removes it."""

    def __init__(self, path: Path, users: int):
        self.path, self._users, self._lock = path, users, threading.Lock()

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            shutil.rmtree(self.path, ignore_errors=True)
