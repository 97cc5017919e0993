"""The warm start of the tests' one-process runs (tests/warm_start.py) gives a script what a cold `python SCRIPT`
gives it: its argv, folder and environment, its own process, its exit code or the signal that ended it, its
stdout and stderr apart, its threads joined and its exit hooks run; and it stands aside when it cannot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import WARM, offline_env, run_captured
from tests.stacks import communicate_or_diagnose

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    warm = "torch" in sys.modules  # never imported here: only a fork of the warm process has it
    if sys.argv[1] == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(600)
    if sys.argv[1] == "raise":
        raise {"value": ValueError, "interrupt": KeyboardInterrupt}[sys.argv[2]]("boom")
    import subprocess  # what the run starts gets a stdin, as a cold run's children do
    print(subprocess.run([sys.executable, "-c", "import sys; print(sys.stdin is not None)"], capture_output=True, text=True).stdout.strip())
    atexit.register(lambda: print("exit hook ran"))
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread joined"))).start()
    print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "flag", os.environ.get("HF_PRETRAIN_WARM_FLAG"))
    print("torch already imported", warm, "left", os.environ.get("DATATROVE_EXECUTOR"), file=sys.stderr)
    print("__main__", __name__, "imported hf_pretrain", any(m.startswith("hf_pretrain") for m in sys.modules))
    sys.exit(int(sys.argv[2]))
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def test_a_warm_script_gets_its_argv_folder_and_environment_and_ends_as_an_interpreter_does(script, tmp_path):
    folder = tmp_path / "here"
    folder.mkdir()
    env = offline_env() | {"HF_PRETRAIN_WARM_FLAG": "set"}
    ran = WARM.run([sys.executable, str(script), "go", "3"], folder, env, timeout=120)
    assert ran is not None, "the warm process refused an environment that differs only in a key of ours"
    code, out, err = ran
    assert code == 3
    assert "argv ['go', '3'] cwd here flag set" in out
    assert "__main__ __main__ imported hf_pretrain False" in out  # none of ours before the fork
    assert out.index("thread joined") < out.index("exit hook ran")  # threads joined, then the exit hooks
    assert "torch already imported True" in err and "argv" not in err
    assert out.splitlines()[0] == "True"


@pytest.mark.parametrize("error, code", [("value", 1), ("interrupt", -signal.SIGINT)])
def test_an_uncaught_exception_ends_a_warm_script_as_it_ends_a_cold_one(script, tmp_path, error, code):
    command = [sys.executable, str(script), "raise", error]
    cold = subprocess.run(command, cwd=tmp_path, env=offline_env(), capture_output=True, text=True, timeout=120)
    warm = WARM.run(command, tmp_path, offline_env(), timeout=120)
    assert warm is not None and warm[0] == cold.returncode == code
    assert cold.stderr.splitlines()[-1] == warm[2].splitlines()[-1] != "boom"  # the same last line: the error itself


def test_a_warm_run_past_its_timeout_is_killed_and_says_where_it_waited(script, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        WARM.run([sys.executable, str(script), "sleep", "0"], tmp_path, offline_env(), timeout=15)
    pid = int(expired.value.output.split()[0])
    with pytest.raises(ProcessLookupError):  # gone, and reaped
        os.kill(pid, 0)
    assert f"Thread {pid}" in str(expired.value) and "script.py:6" in str(expired.value)  # py-spy: the sleep's line


def test_a_cold_run_past_its_timeout_says_where_each_process_waited_and_leaves_none(tmp_path):
    """A worker of torch's launcher lives in a session of its own: the dump and the kill reach it too."""
    code = textwrap.dedent(
        r"""
        import subprocess, sys, time
        def the_launcher_waits():
            time.sleep(600)
        worker = "import os, time\ndef the_worker_waits():\n    time.sleep(600)\nos.setsid()\nthe_worker_waits()"
        print(subprocess.Popen([sys.executable, "-c", worker]).pid, flush=True)
        the_launcher_waits()
        """
    )
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run_captured([sys.executable, "-c", code], tmp_path, offline_env(), timeout=10)
    said = str(expired.value)
    assert "the_launcher_waits" in said and "the_worker_waits" in said
    worker = int(expired.value.output.split()[0])
    # SIGKILL is sent, not awaited: the worker's state follows it within moments (a busy machine: longer)
    deadline = time.monotonic() + 30
    while not killed(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert killed(worker), f"the worker {worker} still runs 30 s after it was killed"


def killed(pid: int) -> bool:
    """Gone (whoever adopted it reaped it), or a zombie until they do."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_environment_the_imports_could_have_read_starts_cold(script, tmp_path):
    env = offline_env() | {"HF_HUB_CACHE": str(tmp_path / "cache")}  # read by huggingface_hub at import
    assert WARM.run([sys.executable, str(script), "go", "0"], tmp_path, env, timeout=120) is None


def test_a_warm_process_is_its_own_process_signals_reach_and_end(script, tmp_path):
    process = WARM.popen([sys.executable, str(script), "sleep", "0"], tmp_path, offline_env(), merge_stderr=True)
    assert process is not None
    assert int(process.stdout.readline()) == process.pid != os.getpid()  # it printed its own pid, live
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == -signal.SIGTERM  # as Popen says a signal ended a process
    assert communicate_or_diagnose(process, 60) == ("", None)  # nothing more said; stderr went to stdout


def test_a_key_left_in_the_workers_environment_warms_a_process_that_has_it(script, tmp_path, monkeypatch):
    """Code run in a test worker leaves keys in its environment (datatrove's, inductor's), which a cold launch
    inherits: the warm process is started again under it, where every later launch would have started cold."""
    monkeypatch.setenv("DATATROVE_EXECUTOR", "LOCAL")
    ran = WARM.run([sys.executable, str(script), "go", "0"], tmp_path, offline_env(), timeout=120)
    assert ran is not None and ran[0] == 0
    assert "torch already imported True left LOCAL" in ran[2]


def test_a_warm_module_run_says_and_exits_what_a_cold_python_m_does(tmp_path):
    """`python -m hf_pretrain.cli ...`: the module as `__main__` with its arguments, in the caller's folder;
    the same output and exit code as a cold start, for a command that works, one that is refused and a module
    that is not there."""
    runs = (("hf_pretrain.cli", ["doctor", "--help"], 0), ("hf_pretrain.cli", ["train", "--no_such_key", "1"], 2))
    for module, argv, code in (*runs, ("hf_pretrain.no_such_module", [], 1)):  # the last: Python's one line
        command = [sys.executable, "-m", module, *argv]
        cold = subprocess.run(command, cwd=tmp_path, env=offline_env(), capture_output=True, text=True, timeout=120)
        warm = WARM.run(command, tmp_path, offline_env(), timeout=120)
        assert warm is not None, "a module of this project started cold"
        assert warm == (cold.returncode, cold.stdout, cold.stderr) and cold.returncode == code, (warm, cold)
    assert WARM.run([sys.executable, "-m", "json.tool", "--help"], tmp_path, offline_env(), timeout=120) is None


def test_every_test_that_waits_on_a_process_of_its_own_says_where_it_waited():
    """A test's own `Popen` waited on with a timeout goes through `communicate_or_diagnose`, so a hang on CI is
    dumped (py-spy) and every process under it ended, not a bare TimeoutExpired and workers left running."""
    needle = ".communicate(" + "timeout="  # spelled apart, so this file is not its own hit
    tests = Path(__file__).parent
    bare = [
        f"{path.name}:{number}"
        for path in sorted(tests.glob("*.py"))
        if path.name not in {"stacks.py", "warm_start.py"}  # the two that dump what they wait on
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if needle in line
    ]
    assert not bare, f"wait with tests/stacks.communicate_or_diagnose(process, timeout): {bare}"
