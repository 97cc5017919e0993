"""The exit codes of a training session, and what each tells whoever restarts the job.

They are the contract with the world outside the process (a job scheduler, a wrapper script, the
README), not a detail of one room: `training/guards.py` returns EXIT_PREEMPTED and EXIT_DIVERGED,
`training/loop.py` EXIT_SAVE_FAILED, `training/session.py` the refusals and the crash. So they live
here, among the shared facts, where any command that refuses before any work can say so the same
way; `training/session.py` writes the same meaning into `status.json` (`ENDINGS`). The numbers
follow BSD's sysexits.h, so a scheduler's generic handling reads them right.
"""

from __future__ import annotations

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal with a good checkpoint; rerun to resume
EXIT_SAVE_FAILED = 74  # EX_IOERR: a checkpoint could not be written; the previous one is intact
EXIT_DIVERGED = 65  # EX_DATAERR: too many non-finite steps in a row
# EX_CONFIG: refused before any work: a preflight check failed, or the checkpoint does not fit the recipe
EXIT_PREFLIGHT = 78
EXIT_LOCKED = 73  # EX_CANTCREAT: another session holds the run folder; nothing was touched
EXIT_HUNG = 69  # EX_UNAVAILABLE: no progress for hang_timeout_s (a process stopped answering); stacks in hangs/
EXIT_CRASHED = 1  # an uncaught exception; the traceback says what failed
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for a process ended by SIGINT (Ctrl-C before the loop)
