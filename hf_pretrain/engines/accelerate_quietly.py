"""`accelerate launch`, run in this process with its errors caught: the launcher `hf-pretrain launch` starts.

Accelerate's simple launcher raises `CalledProcessError` when the trainer exits non-zero (exit 1, and its
traceback after the trainer's one-line refusal; `-q` only trades the traceback for the same 1), and its
multi-process launcher (torchrun's agent, in this process) raises `ChildFailedError`, or
`SignalException` when it is itself signalled. Here each ends this process with the code it carries,
in one line at most; the trainer's own code, from exit_file.py, is what the wrapper finally returns.
Run as `python -m hf_pretrain.engines.accelerate_quietly [accelerate launch arguments]`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from hf_pretrain.exit_codes import EXIT_CONFIG


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell's exit status: a signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def code_of_launcher_error(exc: BaseException) -> int | None:
    """The exit code an error of accelerate's launchers carries; None for any other error (a bug: raised)."""
    if isinstance(exc, subprocess.CalledProcessError):
        return exit_status(exc.returncode)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    name = type(exc).__name__
    if name == "ChildFailedError":  # torch.distributed.elastic: the first process that failed
        failures = sorted(getattr(exc, "failures", {}).values(), key=lambda f: (f.timestamp, f.local_rank))
        return exit_status(failures[0].exitcode) if failures else 1
    if name == "SignalException":  # torchrun's agent itself was signalled; its workers were told so
        return 128 + int(getattr(exc, "sigval", signal.SIGTERM))
    return None


def main(argv: list[str]) -> int:
    from hf_pretrain.processes import die_with_parent

    die_with_parent(signal.SIGTERM)  # the wrapper gone (even by SIGKILL): the job ends with it
    # torchrun's agent logs each failure with a summary table; the trainer's own line said it already,
    # and the wrapper says the code
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except BaseException as exc:  # noqa: B036 (KeyboardInterrupt and torchrun's SignalException included)
        code = code_of_launcher_error(exc)
        if code is None and not a_trainer_started():
            # accelerate checking the launch config's values and the flags (a wrong distributed_type or
            # mixed_precision: ValueError; torch's own asserts): bad input, refused before any work, in one
            # line and 78, not a traceback and 1 (issue 57)
            print(
                f"hf-pretrain launch: error: the launch config or flags were refused: {refusal(exc)}", file=sys.stderr
            )
            return EXIT_CONFIG
        if code is None:
            raise
        return code
    return 0


def a_trainer_started() -> bool:
    """Whether a trainer of this launch began (it leaves its pid where `hf-pretrain launch` reads it)."""
    from pathlib import Path

    from hf_pretrain.engines.exit_file import ENV_VAR, pids_left

    folder = os.environ.get(ENV_VAR)
    return bool(folder) and bool(pids_left(Path(folder)))


def refusal(exc: BaseException) -> str:
    """The error in words, with where to find launch configs that work."""
    said = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return f"{said}; fix it (accelerate_configs/ holds working ones; `accelerate launch --help` lists the flags)"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
