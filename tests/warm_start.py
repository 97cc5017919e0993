"""One-process runs started warm: the tests' `python hf_pretrain/train.py ...` and `python -m hf_pretrain.cli ...`,
forked from a process that has already imported torch, Accelerate and transformers, instead of a fresh interpreter
importing them again.

Why: on CI's two cores a trainer spends about 8 s of a core importing what it needs before its first step (torch
~3 s; transformers' modelling code pulls torch._dynamo, DTensor, scipy and torchao in for ~5 s, docs/testing.md),
and the suite starts over a hundred one-process runs. Forked from a warm process, a run starts at its own code.

What stays the same as a cold start: the trainer is its own process (its own pid, signals, exit code or the
signal that ended it, its stdout and stderr), runs its script as `__main__` with the caller's argv, working
folder and environment, imports every hf_pretrain module itself (none is imported before the fork, so whatever
reads the environment at import reads the caller's), and ends as an interpreter does (threads joined, then the
exit hooks, then the streams flushed). What differs, and when it is not used:
- the third-party modules were imported under the warm process's environment: a launch whose environment
  differs from it in a key the tests do not own (`OWN_KEYS`: this project's switches and faults, the test store's
  credentials) starts cold, as does every launch through a launcher or of several processes;
- the warnings those imports print (torchao's CUDA kernels on a CPU) are printed once, by the warm process.
`HF_PRETRAIN_TESTS_COLD=1` starts every run cold, as the suite did before (`make smoke`, the reference run and
the multi-process and launcher tests start cold anyway).

How: the test worker holds a socket to its warm process and sends one request per launch (argv, folder,
environment), with the write ends of the pipes the launch's stdout, stderr and exit status go to. The warm
process forks a waiter, which forks the run and writes the run's pid, then its exit code, on the status pipe.
The worker ending closes the socket, which ends the warm process; a run still going goes on, as a cold one would.
The warm imports' exit hooks run at the end of each run, as a cold run's own would (matplotlib's, should its
config folder be unwritable, would delete a temporary folder the warm process shares: CI's is writable).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.stacks import Hung, process_stacks

# Keys a test may set for one launch without a cold start: nothing imported before the fork reads them.
OWN_KEYS = ("HF_PRETRAIN_", "AWS_", "PYTEST_")
# What the warm process imports before it forks: what every trainer imports first, the slow part of its start.
WARM_IMPORTS = (
    "torch",
    "accelerate",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "safetensors.torch",
    "matplotlib.figure",  # the model card's loss plot, at the end of every finished run
)
MOST_BYTES = 1 << 20  # a request: argv and environment, a few kB
START_WITHIN_S = 300  # the first request waits for the warm process's imports (~10 s on CI's cores)


def differs_only_in_own_keys(env: dict[str, str], warm_env: dict[str, str]) -> bool:
    """Whether `env` and the warm process's `warm_env` differ only in keys the tests own (`OWN_KEYS`)."""
    changed = {key for key in env.keys() | warm_env.keys() if env.get(key) != warm_env.get(key)}
    return all(key.startswith(OWN_KEYS) for key in changed)


class WarmProcess:
    """A warm-started run, as much of `subprocess.Popen` as the tests use: pid, stdout (and stderr, unless it
    goes to stdout), poll, wait, communicate, send_signal, kill, terminate, returncode."""

    def __init__(self, command: list[str], status: int, stdout: int, stderr: int | None):
        self.args = command
        self._status = status  # read unbuffered: a buffered reader could hold the exit code where select cannot see it
        self._said = b""
        self.stdout = os.fdopen(stdout, "r", errors="replace")
        self.stderr = os.fdopen(stderr, "r", errors="replace") if stderr is not None else None
        pid = self._status_line(START_WITHIN_S)
        if pid is None:
            raise RuntimeError(f"the warm process did not start {command[1]} within {START_WITHIN_S} s")
        self.pid = int(pid)
        self.returncode: int | None = None
        self._readers: list[tuple[threading.Thread, list[str]]] = []

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._status_line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line)
            os.close(self._status)
        return self.returncode

    def _status_line(self, timeout: float | None) -> str | None:
        """The waiter's next line (the pid, then the exit code), or None if none came within `timeout` s."""
        deadline = _deadline(timeout)
        while b"\n" not in self._said:
            with selectors.DefaultSelector() as selector:
                selector.register(self._status, selectors.EVENT_READ)
                if not selector.select(_left(deadline)):
                    return None
            chunk = os.read(self._status, 64)
            if not chunk:
                raise RuntimeError(f"the warm start of {self.args[1]} ended without its exit code")
            self._said += chunk
        line, self._said = self._said.split(b"\n", 1)
        return line.decode()

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Everything the run printed, once it has ended; `subprocess.TimeoutExpired` past `timeout`."""
        if not self._readers:
            for stream in (self.stdout, self.stderr):
                if stream is not None:
                    chunks: list[str] = []
                    reader = threading.Thread(target=lambda s=stream, c=chunks: c.extend(s), daemon=True)
                    reader.start()
                    self._readers.append((reader, chunks))
        deadline = _deadline(timeout)
        for reader, _ in self._readers:
            reader.join(_left(deadline))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(_left(deadline))
        return self.said_so_far()

    def said_so_far(self) -> tuple[str, str | None]:
        """What `communicate` has read of stdout (and stderr) so far."""
        for reader, _ in self._readers:
            reader.join(1.0)  # a process the run started may still hold the pipe: what came is enough
        said = ["".join(chunks) for _, chunks in self._readers]
        return said[0], said[1] if len(said) > 1 else None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may be another process's by now
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _a_script(path: str) -> bool:
    return path.endswith(".py") and Path(path).is_file()


def _a_module(argv: list[str]) -> bool:
    """`-m hf_pretrain.X ...`: this project's own modules only (nothing of theirs is imported before the fork)."""
    return len(argv) > 1 and argv[0] == "-m" and argv[1].split(".")[0] == "hf_pretrain"


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (never below 0), or None: no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class WarmStarter:
    """The test worker's side: its warm process, started on first use."""

    def __init__(self, base_env: Callable[[], dict[str, str]]):
        self._base_env = base_env  # what a launch's environment is made from: the warm process imports under it
        self._env: dict[str, str] = {}
        self._server: subprocess.Popen | None = None
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def popen(self, command: list[str], cwd: Path, env: dict[str, str], merge_stderr: bool) -> WarmProcess | None:
        """`command` (`python SCRIPT ARGS...` or `python -m hf_pretrain.MODULE ARGS...`) started warm in `cwd` with
        `env`, its stdout (with its stderr when `merge_stderr`) piped: None, having started nothing, when it cannot
        start warm (start it cold)."""
        if os.environ.get("HF_PRETRAIN_TESTS_COLD") == "1" or command[0] != sys.executable:
            return None
        if not Path(cwd).is_dir() or not (_a_script(command[1]) or _a_module(command[1:])):
            return None  # another flag, or a script that is not there: a cold start says so as Python does
        with self._lock:
            base = self._base_env()
            if not differs_only_in_own_keys(base, self._env):
                # The worker's own environment changed since the warm process started: code run in the tests'
                # process leaves keys behind (datatrove's DATATROVE_*, inductor's, lm-eval's KMP_...), which a
                # cold launch inherits too. A new warm process imports under the new one (~10 s, a few times
                # a session); the old one ends when its socket closes, its runs going on.
                self._env, self._server = base, None
            if not differs_only_in_own_keys(env, self._env):
                return None
            request = {"argv": command[1:], "cwd": str(cwd), "env": env, "merge_stderr": merge_stderr}
            pipes = [os.pipe() for _ in range(2 if merge_stderr else 3)]  # status, stdout[, stderr]
            try:
                socket.send_fds(self._started(), [json.dumps(request).encode()], [w for _, w in pipes])
            except OSError:  # the warm process is gone: this launch starts cold, the next one warms a new one
                self._server = None
                for read_end, _ in pipes:
                    os.close(read_end)
                return None
            finally:
                for _, write_end in pipes:
                    os.close(write_end)
        reads = [r for r, _ in pipes]
        return WarmProcess(command, reads[0], reads[1], None if merge_stderr else reads[2])

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str] | None:
        """As `subprocess.run(command, capture_output=True, timeout=timeout)`: (exit code, stdout, stderr), the run
        killed past `timeout` (`subprocess.TimeoutExpired`); None when it cannot start warm."""
        process = self.popen(command, cwd, env, merge_stderr=False)
        if process is None:
            return None
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = process_stacks(process.pid)  # where it waited, for the failure's message
            process.kill()  # as subprocess.run: kill, wait, and say what was printed so far
            process.wait()
            out, err = process.said_so_far()
            raise Hung(command, timeout, stacks, output=out, stderr=err) from None
        except BaseException:
            process.kill()
            raise
        return process.returncode, out, err or ""

    def _started(self) -> socket.socket:
        if self._server is None or self._server.poll() is not None:
            if self._socket is not None:
                self._socket.close()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            command = [sys.executable, "-m", "tests.warm_start"]
            self._server = subprocess.Popen(command, env=self._env, stdin=theirs, stdout=subprocess.DEVNULL)
            theirs.close()
            self._socket = ours
        return self._socket


# ---- the warm process ----


def _serve() -> None:
    import importlib

    for name in WARM_IMPORTS:
        importlib.import_module(name)
    requests = socket.socket(fileno=0)
    while True:
        message, fds, _, _ = socket.recv_fds(requests, MOST_BYTES, 3)
        if not message:
            return  # the test worker ended
        sys.stdout.flush()
        sys.stderr.flush()  # nothing buffered here is printed again by a child
        if os.fork() == 0:
            try:  # the waiter never returns into this loop, whatever happens in it
                requests.close()
                _wait_for_run(json.loads(message), fds)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        while _reaped():
            pass


def _reaped() -> bool:
    try:
        return os.waitpid(-1, os.WNOHANG)[0] > 0
    except ChildProcessError:
        return False


def _wait_for_run(request: dict, fds: list[int]) -> None:
    """The waiter: fork the run, say its pid, wait for it, say its exit code."""
    status, *outputs = fds
    pid = os.fork()
    if pid == 0:
        os.close(status)
        _become(request, outputs)  # ends in os._exit
    for fd in outputs:
        os.close(fd)
    os.write(status, f"{pid}\n".encode())
    _, how = os.waitpid(pid, 0)
    os.write(status, f"{os.waitstatus_to_exitcode(how)}\n".encode())


def _become(request: dict, outputs: list[int]) -> None:
    """Become `python ARGV...` in the request's folder and environment; exit as that interpreter would."""
    import atexit
    import ctypes
    import runpy
    import types

    code, interrupted = 1, False
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _stdin_from_devnull()
        os.dup2(outputs[0], 1)
        os.dup2(outputs[-1], 2)
        for fd in outputs:
            os.close(fd)
        try:
            if request["argv"][0] == "-m":
                # as `python -m MODULE` runs it (runpy's own entry for -m): in a `__main__` of its own, the folder on
                # the path, argv[0] the module's file until the end (exit hooks see it), one line for a missing module
                module, *args = request["argv"][1:]
                sys.argv, sys.path[0] = ["-m", *args], os.getcwd()
                sys.modules["__main__"] = types.ModuleType("__main__")
                runpy._run_module_as_main(module)
            else:
                script, *args = request["argv"]
                sys.argv, sys.path[0] = [script, *args], str(Path(script).resolve().parent)
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except KeyboardInterrupt:
            interrupted = True  # Python ends such a process by the SIGINT itself, below
            sys.excepthook(*sys.exc_info())
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        try:
            threading._shutdown()  # what an interpreter does at its end: wait for the threads it must,
        except BaseException:
            sys.excepthook(*sys.exc_info())
        atexit._run_exitfuncs()  # then run its exit hooks
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        ctypes.CDLL(None).fflush(None)  # and what C code printed
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _stdin_from_devnull() -> None:
    """fd 0 on /dev/null, inherited by what the run starts (os.open's descriptors are not inherited by default)."""
    fd = os.open(os.devnull, os.O_RDONLY)
    if fd != 0:
        os.dup2(fd, 0)
        os.close(fd)
    else:
        os.set_inheritable(0, True)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve()
