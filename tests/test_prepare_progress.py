"""What `prepare` shows a person: one live line per source (tokens, rate, tasks done of N, documents,
a share and an ETA where the input's size says), and none of datatrove's own log (it goes to
data_dir/logs/<source>/output.log, on the screen only with --verbose)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

from hf_pretrain.data.task_progress import (
    COUNTS_DIR,
    CountsReader,
    SourceProgress,
    TaskCounts,
    Totals,
    estimated_tokens,
)
from tests.helpers import OUTSIDE_CHECKOUT, offline_env
from tests.test_prepare import cli_args, corpus  # noqa: F401  (a fixture)

# what datatrove's log looks like on a screen: loguru's lines, its stats blocks
DATATROVE_LINE = re.compile(r"\| (INFO|SUCCESS|WARNING|DEBUG) +\||Stats:|📖|🔢|All \d+ tasks|tasks completed")


def on_a_terminal(args: list[str], columns: int = 160, timeout_s: float = 300) -> tuple[int, str]:
    """Run `hf-pretrain prepare ARGS` with its output on a pseudo-terminal `columns` wide, as a person sees it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "hf_pretrain.cli", "prepare", *args],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks, deadline = [], time.time() + timeout_s
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end is closed: the process has ended
            break
        if not chunk:
            break
        chunks.append(chunk)
        assert time.time() < deadline, "prepare did not end"
    os.close(master)
    return process.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_prepare_on_a_terminal_shows_a_live_line_per_source_and_no_datatrove_log(corpus, tmp_path) -> None:  # noqa: F811
    data_dir = tmp_path / "data"
    code, screen = on_a_terminal(cli_args(corpus, data_dir) + ["--workers", "2"])
    assert code == 0, screen
    # each redraw of the bar is a carriage return: the last state of each source's line
    lines = [part.strip() for line in screen.splitlines() for part in line.split("\r") if part.strip()]
    last = {}
    for line in lines:
        if line.startswith(("00-", "01-")) and "tokens/s" in line and "[" in line:
            last[line[:2]] = line
    jsonl, txt = last["00"], last["01"]
    assert "tasks 4/4" in jsonl and "1,600 documents" in jsonl and "100%" in jsonl, jsonl
    assert "tasks 1/1" in txt and "1 documents" in txt, txt  # a small .txt file is one document
    assert not [line for line in lines if DATATROVE_LINE.search(line)], screen
    # the few lines around the bars: the tokenizer, a line per source, the summary
    words = [line for line in lines if "[" not in line]
    assert len(words) <= 10, screen
    log = (data_dir / "logs" / f"00-{corpus.name}" / "output.log").read_text()
    assert DATATROVE_LINE.search(log), "datatrove's log goes to output.log"
    counts = [json.loads(p.read_text()) for p in (data_dir / "logs" / f"00-{corpus.name}" / COUNTS_DIR).glob("*.json")]
    assert sum(c["documents"] for c in counts) == 1600 and len(counts) == 4


def test_verbose_shows_datatrove_log_on_the_screen(corpus, tmp_path) -> None:  # noqa: F811
    out = subprocess.run(
        [sys.executable, "-m", "hf_pretrain.cli", "prepare", *cli_args(corpus, tmp_path / "data"), "--verbose"],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert DATATROVE_LINE.search(out.stderr), out.stderr


def test_the_counts_of_a_task_add_up_and_estimate_the_whole_from_the_share_read(tmp_path) -> None:
    logs = tmp_path / "logs"
    counts = TaskCounts(logs, 0)
    counts.add(10, 1000, 250)
    counts.add(10, 1000, 500)  # within a second: not written yet
    assert json.loads(counts.path.read_text())["tokens"] == 1000
    counts.write()
    reader = CountsReader(logs, task_bytes=[1000, 1000])
    totals = reader.totals()
    assert (totals.documents, totals.tokens, totals.input_bytes, totals.tasks_done) == (20, 2000, 500, 0)
    # a quarter of 2000 bytes read for 2000 tokens: 8000 in all; a max_tokens cap below that wins
    assert estimated_tokens(totals, 2000, 0) == 8000
    assert estimated_tokens(totals, 2000, 5000) == 5000
    assert estimated_tokens(Totals(tokens=3), 0, 0) is None
    # task 0 finished: its file's whole size counts as read; an unfinished task's counts are forgotten
    (logs / "completions").mkdir()
    (logs / "completions" / "00000").write_text("")
    TaskCounts(logs, 1).write()
    assert reader.totals().input_bytes == 1000 and reader.totals().tasks_done == 1
    reader.forget_unfinished()
    assert sorted(p.name for p in (logs / COUNTS_DIR).iterdir()) == ["00000.json"]


def test_off_a_terminal_the_line_is_plain_with_an_estimated_time_left(tmp_path) -> None:
    class Log:  # a log file: not a terminal
        lines: list[str] = []

        def isatty(self) -> bool:
            return False

        def write(self, text: str) -> None:
            self.lines.append(text)

        def flush(self) -> None:
            pass

    progress = SourceProgress("00-corpus", tmp_path, 4, Log(), task_bytes=[100] * 4)  # type: ignore[arg-type]
    with progress:
        progress.started -= 10  # ten seconds in
        line = progress.plain_line(Totals(tasks_done=1, documents=5, tokens=1000, input_bytes=100))
    assert "\r" not in line and line.startswith("00-corpus: 1,000 tokens, 5 documents, tasks 1/4, 100 tokens/s")
    assert "about 0m30s left (estimate)" in line  # a quarter read in 10 s: 3000 tokens to go at 100/s
    assert not Log.lines  # no bar off a terminal


def test_a_failure_in_the_tokenizing_shows_the_end_of_datatrove_log(corpus, tmp_path, monkeypatch, capsys) -> None:  # noqa: F811
    import pytest

    from hf_pretrain.data.pipeline import SplitTokenizer
    from hf_pretrain.data.prepare_run import prepare
    from tests.test_prepare import recipe_for

    def broken(self, texts):
        raise RuntimeError("a defect in the tokenizer step")

    monkeypatch.setattr(SplitTokenizer, "_encode", broken)
    lines: list[str] = []
    with pytest.raises(RuntimeError):
        prepare(recipe_for(corpus, tmp_path / "data"), log=lines.append)
    shown = capsys.readouterr().err
    assert "a defect in the tokenizer step" in shown, shown  # the end of output.log, with the traceback
    assert any("the end of datatrove's log" in line and "output.log" in line for line in lines), lines
