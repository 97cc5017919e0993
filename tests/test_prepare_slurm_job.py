"""A Slurm job that `prepare` submitted keeps writing after `prepare` returned and let go of its lock:
the folder records the job, and a second `prepare` is refused by the job's id while Slurm still lists
it (stand-ins for sbatch, squeue, srun, scontrol)."""

from __future__ import annotations

import json
import os
import stat

from hf_pretrain.exit_codes import EXIT_LOCKED
from tests.stacks import communicate_or_diagnose
from tests.test_prepare import (  # noqa: F401  (corpus: a fixture)
    STANDIN_SBATCH,
    STANDIN_SCONTROL,
    STANDIN_SRUN,
    cli_args,
    corpus,
    run_prepare,
)

# submits (records the script) and returns at once; with STANDIN_RUN set, runs the job here as it is submitted
SBATCH_THAT_RETURNS = """#!/bin/bash
if [ -n "$STANDIN_RUN" ]; then exec "$STANDIN_DIR/sbatch-run" "$@"; fi
cp "${@: -1}" "$STANDIN_DIR/queued_$(date +%s%N).slurm"
echo "Submitted batch job 4343"
"""
SQUEUE = """#!/bin/bash
# the job is listed while $STANDIN_DIR/running exists
[ -f "$STANDIN_DIR/running" ] && echo RUNNING
exit 0
"""


def standin_cluster(folder):
    folder.mkdir()
    scripts = {
        "sbatch": SBATCH_THAT_RETURNS,
        "sbatch-run": STANDIN_SBATCH,
        "squeue": SQUEUE,
        "srun": STANDIN_SRUN,
        "scontrol": STANDIN_SCONTROL,
    }
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod((folder / name).stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "STANDIN_DIR": str(folder)}


def test_a_prepare_while_its_slurm_job_runs_is_refused_by_job_id_then_finishes_after(corpus, tmp_path) -> None:  # noqa: F811
    env = standin_cluster(tmp_path / "bin")
    data_dir = tmp_path / "data"
    args = cli_args(corpus, data_dir) + ["--executor", "slurm", "--slurm_partition", "cpu", "--workers", "0"]
    (tmp_path / "bin" / "running").write_text("")
    submit = run_prepare(args, env=env)
    out = communicate_or_diagnose(submit, 300)[0].decode()
    assert submit.returncode == 0, out
    assert "Slurm job 4343" in out and "squeue -j 4343" in out, out
    progress = json.loads((data_dir / "prepare_progress.json").read_text())
    assert [job["job_id"] for job in progress["jobs"]] == ["4343", "4343"]  # one job per source
    tokenizer = (data_dir / "tokenizer" / "tokenizer.json").read_bytes()

    for extra in ([], ["--vocab_size", "320"]):  # the same command, and one with other settings
        again = run_prepare(args + extra, env=env)
        out = communicate_or_diagnose(again, 300)[0].decode()
        assert again.returncode == EXIT_LOCKED, out
        assert "Slurm job 4343" in out and "RUNNING" in out and "scancel 4343" in out, out
        assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
        assert (data_dir / "tokenizer" / "tokenizer.json").read_bytes() == tokenizer  # nothing discarded

    (tmp_path / "bin" / "running").unlink()  # the job is over (its tasks never ran): the next prepare goes on
    done = run_prepare(args, env=env | {"STANDIN_RUN": "1"})
    out = communicate_or_diagnose(done, 300)[0].decode()
    assert done.returncode == 0, out
    assert (data_dir / "meta.json").is_file() and not (data_dir / "prepare_progress.json").exists(), out
