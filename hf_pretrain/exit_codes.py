"""The exit codes of every `hf-pretrain` command, and what each tells whoever runs it again.

They are the contract with the world outside the process (a job scheduler, a wrapper script, the
README), not a detail of one room: `training/guards.py` returns EXIT_PREEMPTED and EXIT_DIVERGED,
`training/loop.py` EXIT_SAVE_FAILED, `training/session.py` the refusals and the crash; every other
command refuses bad input with EXIT_CONFIG and a full disk with EXIT_WRITE_FAILED, and `config/parse.py`
ends a command line that does not parse with EXIT_USAGE. `training/session.py` writes the same meaning
into `status.json` (`ENDINGS`). The numbers follow BSD's sysexits.h, so a scheduler's generic handling
reads them right. `CONTRACT` is the table docs/survival.md shows (tests/test_exit_codes.py holds both
to it, and every command to it). This module imports nothing: `config/` reads it too.
"""

from __future__ import annotations

EXIT_OK = 0  # done
# the command ran and failed: an uncaught exception (the traceback says what), or what it ran failed
# (a bench variant, an upload the Hub refused)
EXIT_FAILED = 1
EXIT_CRASHED = EXIT_FAILED  # a training session's name for it (status.json: crashed)
EXIT_USAGE = 2  # the command line does not parse (argparse: an unknown flag, a missing value); nothing done
EXIT_DIVERGED = 65  # EX_DATAERR: too many non-finite steps in a row
EXIT_HUNG = 69  # EX_UNAVAILABLE: no progress for hang_timeout_s (a process stopped answering); stacks in hangs/
# EX_OSERR: `check` found the machine faulty (GPU memory errors, remapped rows, a throttled or slow card):
# rent another; an engine's task relaunches elsewhere on it (hf_pretrain/engines/)
EXIT_FAULTY_HOST = 71
EXIT_LOCKED = 73  # EX_CANTCREAT: another session holds the run (or data) folder; nothing was touched
EXIT_WRITE_FAILED = 74  # EX_IOERR: the disk refused a write (full, quota); what was there before is intact
EXIT_SAVE_FAILED = EXIT_WRITE_FAILED  # a training session's name for it: a checkpoint could not be written
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal with a good checkpoint; rerun to resume
# EX_CONFIG: refused before any work, one line naming the fix: a bad value, a missing folder, a recipe
# the checkpoint does not fit, a preflight check failed (the doctor says the same of a run)
EXIT_CONFIG = 78
EXIT_PREFLIGHT = EXIT_CONFIG  # a training session's name for it (status.json: refused)
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for a process ended by SIGINT (Ctrl-C before the loop)

# code -> (name, what happened), the table of docs/survival.md
CONTRACT: dict[int, tuple[str, str]] = {
    EXIT_OK: ("ok", "done"),
    EXIT_FAILED: ("failed", "the command ran and failed: an uncaught exception, or what it ran failed"),
    EXIT_USAGE: ("usage", "the command line does not parse (an unknown flag, a missing value); nothing done"),
    EXIT_DIVERGED: ("diverged", "training: `max_bad_steps` non-finite steps in a row; a checkpoint written"),
    EXIT_HUNG: ("hung", "training: a process stopped answering for `hang_timeout_s`; stacks in `hangs/`"),
    EXIT_FAULTY_HOST: (
        "faulty_host",
        "check: the GPU is faulty or slow (ECC, remapped rows, throttling); rent another",
    ),
    EXIT_LOCKED: ("locked", "another session holds the run (or data) folder; nothing touched"),
    EXIT_WRITE_FAILED: ("write_failed", "the disk refused a write (full, quota, I/O); what was there is intact"),
    EXIT_PREEMPTED: ("preempted", "training: SIGTERM / SIGINT, the step finished, a checkpoint written"),
    EXIT_CONFIG: ("refused", "bad input, refused before any work in one line that names the fix"),
    EXIT_INTERRUPTED: ("interrupted", "Ctrl-C before the training loop began"),
}
