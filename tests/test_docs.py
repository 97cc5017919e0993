"""The documentation points at what exists (issue 35).

- every relative link and image of README.md and docs/*.md names a file of the repository, and a
  `#anchor` names a heading of that page;
- every command the front page shows is one the product takes: an `hf-pretrain` subcommand that
  exists, each flag listed by its `--help`, parsed the same in snake and kebab case; the `accelerate
  launch` lines' flags and config files; the `make` targets;
- the pictures in docs/images/ are what `hf-pretrain report` draws today from the run records they
  were drawn from (tests/assets/smoke_run/), and the phase table beside them is that run's;
- the front page stays a front page (250 lines at most).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from hf_pretrain.cli import COMMANDS
from hf_pretrain.config import CommandParser
from tests.helpers import ROOT
from tests.regenerate_docs_images import IMAGES, PICTURES, RUN_RECORDS, draw

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRONT_PAGE = ROOT / "README.md"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
FLAG = re.compile(r"^--[a-z][a-z0-9_-]*")


def prose(text: str) -> str:
    """A page without its code blocks (a link in a code block is not a link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page.read_text()).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            base = slug(m.group(1))
            name, n = base, 0
            while name in found:  # GitHub numbers repeated headings: name, name-1, name-2
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_link_reader_finds_links_images_and_anchors():
    text = "See [a](docs/x.md#the-end), ![plot](images/p.png) and [b](https://h.co).\n```\n[c](no.md)\n```\n"
    assert LINK.findall(prose(text)) == ["docs/x.md#the-end", "images/p.png", "https://h.co"]
    assert slug("Costs and planning: `plan`, `bench`, `report`") == "costs-and-planning-plan-bench-report"
    assert slug("What `prepare` guarantees") == "what-prepare-guarantees"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading `#{anchor}` in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_guide_links_every_page_of_docs():
    """No page of the guide is an orphan: the front page or the guide's index links each."""
    linked = {
        (page.parent / t.partition("#")[0]).resolve()
        for page in (FRONT_PAGE, ROOT / "docs" / "README.md")
        for t in relative_links(page)
    }
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked and p.name != "README.md"]
    assert not orphans


# ---------------------------------------------------------------------- the front page's commands
def front_page_commands() -> list[str]:
    """Every command line the front page shows: code block lines (continuations joined, comments cut)
    and inline `hf-pretrain ...` spans."""
    text = FRONT_PAGE.read_text()
    lines: list[str] = []
    for block in FENCE.findall(text):
        body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
        lines += [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()]
    lines += re.findall(r"`(hf-pretrain [^`]+)`", prose(text))
    # the Quickstart's `.venv/bin/hf-pretrain ...` (the line that works with nothing activated) is the same CLI
    lines = [line.removeprefix(".venv/bin/") for line in lines]
    commands = [line for line in lines if line.split(" ", 1)[0] in ("hf-pretrain", "accelerate", "make")]
    return list(dict.fromkeys(commands))


def words(command: str) -> list[str]:
    """The command's words, optional `[--flag value]` parts included as given."""
    return shlex.split(command.replace("[", " ").replace("]", " "))


class Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


@contextlib.contextmanager
def stop_at_the_parse(monkeypatch):
    """Commands stop as soon as a parse has read every argument: nothing after it runs (no data read,
    no network), and what was parsed is raised with `Parsed`."""
    original = CommandParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = original(self, args, namespace)
        if not extras:
            raise Parsed(vars(parsed))
        return parsed, extras

    monkeypatch.setattr(CommandParser, "parse_known_args", parse_known_args)
    yield


def parse_command(module: str, argv: list[str], monkeypatch) -> dict:
    import importlib

    main = importlib.import_module(module).main
    err = io.StringIO()
    with stop_at_the_parse(monkeypatch), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except Parsed as parsed:
            return parsed.namespace
        except SystemExit as exit_:
            pytest.fail(f"{module} {' '.join(argv)} was refused ({exit_.code}): {err.getvalue().strip()[-300:]}")
    pytest.fail(f"{module} {' '.join(argv)} ran without parsing its arguments")


def kebab(argv: list[str]) -> list[str]:
    return [a.replace("_", "-") if FLAG.match(a) else a for a in argv]


def help_text(module: str) -> str:
    import importlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    return out.getvalue()


def hf_pretrain_argv(command: str) -> tuple[str, list[str]]:
    """(module that runs it, its arguments) of an `hf-pretrain ...` or `accelerate launch ... train.py` line."""
    argv = words(command)
    if argv[0] == "hf-pretrain" and argv[1] != "launch":  # `hf-pretrain launch`: accelerate's flags, then train's
        assert argv[1] in COMMANDS, f"`{command}`: hf-pretrain has no command `{argv[1]}`"
        return COMMANDS[argv[1]][0], argv[2:]
    script = next(i for i, a in enumerate(argv) if a in ("hf_pretrain/train.py", "hf_pretrain.train"))
    return "hf_pretrain.train", argv[script + 1 :]


def test_the_front_page_shows_the_commands_of_a_whole_run():
    commands = front_page_commands()
    shown = {words(c)[1] for c in commands if c.startswith("hf-pretrain ")}
    assert {"prepare", "stop", "export", "eval", "demo", "space", "plan", "bench"} <= shown
    assert "make smoke" in commands and "make test" in commands
    assert any("hf_pretrain/train.py" in c for c in commands)


@pytest.mark.parametrize(
    "command", [c for c in front_page_commands() if c.startswith(("hf-pretrain", "accelerate"))], ids=str
)
def test_every_front_page_command_is_taken_in_both_spellings(command, monkeypatch):
    taken_in_both_spellings(command, monkeypatch)


def taken_in_both_spellings(command: str, monkeypatch) -> None:
    if words(command) == ["hf-pretrain", "launch"]:  # the launcher named in prose: its arguments are accelerate's
        assert "launch" in COMMANDS
        return
    module, argv = hf_pretrain_argv(command)
    listed = help_text(module)
    if argv == ["--help"]:
        return  # shown as such: it answered above
    flags = [a.split("=", 1)[0] for a in argv if FLAG.match(a)]
    unlisted = [f for f in flags if f not in listed]
    assert not unlisted, f"`{command}`: not in `--help`: {unlisted}"
    snake = parse_command(module, argv, monkeypatch)
    assert parse_command(module, kebab(argv), monkeypatch) == snake, f"`{command}` reads otherwise in kebab case"


# ---------------------------------------------------------------------- the guide's commands
GUIDE = sorted((ROOT / "docs").glob("*.md"))


def guide_commands() -> list[str]:
    """Every `hf-pretrain ...` line of the guide's shell blocks (```bash: what a reader pastes; a plain
    block is what a command printed)."""
    lines: list[str] = []
    for page in GUIDE:
        for block in FENCE.findall(page.read_text()):
            if block.split("\n", 1)[0].strip() not in ("```bash", "```sh"):
                continue
            body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
            lines += [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()]
    return list(dict.fromkeys(line for line in lines if line.startswith("hf-pretrain ")))


@pytest.mark.parametrize("command", guide_commands(), ids=str)
def test_every_guide_command_is_taken_in_both_spellings(command, monkeypatch, tmp_path):
    """Each command the guide shows is one the product takes (issue 38: docs/demo.md showed a `space` that
    is refused). A recipe file of the reader's own (`--recipe proxy.yaml`) is read as the smoke recipe: its
    keys are every recipe's."""
    argv = words(command)
    recipe = argv[argv.index("--recipe") + 1] if "--recipe" in argv else None
    if recipe and recipe.endswith(".yaml"):
        monkeypatch.chdir(tmp_path)
        (tmp_path / recipe).write_text((ROOT / "recipes" / "smoke.yaml").read_text())
    taken_in_both_spellings(command, monkeypatch)


def launch_lines() -> list[str]:
    """The front page's and the guide's launch lines: `accelerate launch ...` and `hf-pretrain launch ...`."""
    every = front_page_commands() + guide_commands()
    launches = [c for c in every if c.startswith(("accelerate launch", "hf-pretrain launch"))]
    return list(dict.fromkeys(c for c in launches if "hf_pretrain" in c))  # a full line, not the name in prose


@pytest.mark.parametrize("command", launch_lines(), ids=str)
def test_the_launch_lines_name_accelerate_flags_and_configs_that_exist(command):
    from accelerate.commands.launch import launch_command_parser

    argv = words(command)[2:]
    launcher = argv[: next(i for i, a in enumerate(argv) if a.startswith("hf_pretrain") or a == "-m")]
    known = launch_command_parser()._option_string_actions
    assert [a for a in launcher if FLAG.match(a) and a not in known] == []
    config = launcher[launcher.index("--config_file") + 1]
    assert (ROOT / config).is_file(), config


# Guide commands a reader can run offline on a CPU in a fresh folder, in this order (a later one reads what an
# earlier one wrote); the expensive ones (training, bench, eval) are tested elsewhere.
RUNS_OFFLINE = [
    "hf-pretrain plan --recipe 1b",
    "hf-pretrain prepare --recipe smoke",
    "hf-pretrain prepare --recipe my-corpus.yaml",
    "hf-pretrain doctor --recipe my-corpus.yaml",
]


def my_corpus(folder: Path) -> None:
    """docs/prepare.md's own-files recipe, verbatim, beside a corpus of the shape it describes: `notes/*.txt`
    and `articles.jsonl`, with words enough for its 4,096-token BPE."""
    import json
    import random

    page = (ROOT / "docs" / "prepare.md").read_text()
    recipe = next(b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "kind: files" in b)
    (folder / "my-corpus.yaml").write_text(recipe)
    rng = random.Random(0)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))) for _ in range(3000)
    ]

    def text() -> str:
        return " ".join(rng.choice(vocabulary) for _ in range(300))

    (folder / "notes").mkdir()
    for i in range(60):
        (folder / "notes" / f"note-{i:02d}.txt").write_text(text())
    (folder / "articles.jsonl").write_text("".join(json.dumps({"text": text()}) + "\n" for _ in range(200)))


@pytest.mark.slow
def test_the_guide_commands_that_run_offline_on_a_cpu_run_as_shown(tmp_path):

    from tests.helpers import cli

    shown = guide_commands()
    assert [c for c in RUNS_OFFLINE if c not in shown] == []
    my_corpus(tmp_path)
    for command in RUNS_OFFLINE:  # offline_env has this checkout on PYTHONPATH
        run = cli(*words(command)[1:], cwd=tmp_path, timeout=600)
        assert run.returncode == 0 and "Traceback" not in run.stderr, f"`{command}`: {run.stderr[-2000:]}"
    assert (tmp_path / "data" / "my-corpus" / "sources" / "00-notes").is_dir()  # the source's `name`
    assert (tmp_path / "data" / "smoke" / "meta.json").is_file()


def test_the_make_targets_exist():
    targets = set(re.findall(r"^([a-z_]+):", (ROOT / "Makefile").read_text(), re.M))
    missing = [c for c in front_page_commands() if c.startswith("make ") and c.split()[1] not in targets]
    assert not missing


# ---------------------------------------------------------------------- the first hour after `make smoke`
def makefile_variables() -> dict[str, str]:
    """The Makefile's `NAME := value` / `NAME ?= value` assignments, `$(OTHER)` in them expanded."""
    assigned = dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*(.*?)\s*$", (ROOT / "Makefile").read_text(), re.M))
    expand = lambda value: re.sub(r"\$\((\w+)\)", lambda m: expand(assigned.get(m[1], "")), value)  # noqa: E731
    return {name: expand(value) for name, value in assigned.items()}


def smoke_advice() -> str:
    """The command of `make smoke`'s last line, `next: COMMAND   # why`, as it prints it (variables expanded)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^smoke:.*?\n((?:\t.*\n|#.*\n)+)", makefile, re.M)[1]
    last = [line for line in recipe.splitlines() if line.startswith("\t")][-1]
    said = re.fullmatch(r"\t@echo '(.*)'", last)
    assert said and said[1].startswith("next: "), f"make smoke's last line is no `next:` advice: {last!r}"
    variables = makefile_variables()
    return re.sub(r"\$\((\w+)\)", lambda m: variables[m[1]], said[1]).removeprefix("next: ")


def a_fresh_shell() -> dict[str, str]:
    """The environment of a new terminal in which nothing was activated: no venv's bin on the PATH, no
    VIRTUAL_ENV, no PYTHONPATH (the suite itself runs from .venv/bin, often activated)."""
    import os
    import sys

    venv_bins = {str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p.rstrip("/") not in venv_bins]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return {**env, "PATH": os.pathsep.join(path or ["/usr/bin", "/bin"]), "HF_HUB_OFFLINE": "1"}


def test_the_advice_of_make_smoke_is_the_readmes_next_command():
    """`make smoke` ends with what to run next, and the Quickstart shows the same line (issue 57: the README's
    `hf-pretrain report ...` was `command not found` after `make smoke`: the CLI is in .venv/bin)."""
    advice = smoke_advice()
    command = advice.split("#")[0].strip()
    assert command.startswith(".venv/bin/hf-pretrain "), advice  # names where the CLI is: no activation needed
    page = FRONT_PAGE.read_text()
    section = page[page.index("## Quickstart") :].split("\n## ", 1)[0]
    first, *after = FENCE.findall(section)
    assert command not in first  # the Quickstart's own block is the two commands; the next one follows them
    assert any(command in block for block in after), f"README's Quickstart does not show make smoke's next: {command}"


@pytest.mark.slow
def test_the_advice_of_make_smoke_works_pasted_in_a_shell_with_nothing_activated(reference_run, tmp_path):
    """The `next:` line run as a new user pastes it, in a shell with no venv activated, beside a `runs/smoke`
    (the reference run's records: `make smoke` is not run inside the suite) and the checkout's .venv."""
    import shutil
    import subprocess

    venv = ROOT / ".venv"
    if not (venv / "bin" / "hf-pretrain").is_file():
        pytest.skip("no .venv/bin/hf-pretrain: the suite runs outside `make test`'s venv")
    (tmp_path / ".venv").symlink_to(venv)
    shutil.copytree(
        reference_run[0], tmp_path / "runs" / "smoke", ignore=shutil.ignore_patterns("checkpoints", "final")
    )
    env = a_fresh_shell()
    bare = subprocess.run(["bash", "-c", "command -v hf-pretrain"], env=env, capture_output=True, text=True)
    assert str(venv) not in bare.stdout  # the test's shell is a fresh one: the venv's CLI is not on its PATH
    ran = subprocess.run(
        ["bash", "-c", smoke_advice()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, f"`{smoke_advice()}` failed ({ran.returncode}): {ran.stderr[-2000:]}"
    assert (tmp_path / "runs" / "smoke" / "report" / "report.md").is_file()


def test_the_readmes_launch_line_passes_every_secret_of_the_task_file():
    """SkyPilot takes a task whose `secrets:` were not given at launch, and the job then cannot reach its
    store: the README's `sky jobs launch` line must pass each one (issue 57: it dropped both)."""
    import yaml

    task = yaml.safe_load((ROOT / "hf_pretrain" / "engines" / "skypilot" / "1b.yaml").read_text())
    body = "\n".join(FENCE.findall(FRONT_PAGE.read_text())).replace("\\\n", " ")
    launch = [line for line in body.splitlines() if line.startswith("sky jobs launch")]
    assert len(launch) == 1, launch
    argv = shlex.split(launch[0])
    given = {argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--secret"}
    assert task["secrets"] and set(task["secrets"]) <= given, f"not passed: {set(task['secrets']) - given}"
    assert argv[3] == "hf_pretrain/engines/skypilot/1b.yaml"  # the file whose secrets were read


def test_a_flag_the_product_does_not_take_is_caught(monkeypatch):
    """The checks above are not vacuous: a misspelt flag fails both."""
    module, argv = hf_pretrain_argv("hf-pretrain plan --recipe 1b --gpu_count 8")
    assert "--gpu_count" not in help_text(module)
    with pytest.raises(pytest.fail.Exception, match="unknown key `gpu_count`"):
        parse_command(module, argv, monkeypatch)


# A front page read in five minutes at 230 words a minute, its two commands in the first two (issue 45: it
# was 1,821 words, eight minutes, measurement tables and development history before the Quickstart).
FRONT_PAGE_WORDS = 1_150
WORDS_BEFORE_THE_COMMANDS = 460


def test_the_front_page_is_a_front_page():
    text = FRONT_PAGE.read_text()
    assert len(text.splitlines()) <= 250
    assert len(text.split()) <= FRONT_PAGE_WORDS, f"README.md is {len(text.split()):,} words"
    before = text[: text.index("make test")].split()
    assert "make" in before and len(before) <= WORDS_BEFORE_THE_COMMANDS, f"`make test` comes after {len(before)} words"


def test_the_testing_page_states_the_front_pages_limits_the_test_holds():
    """docs/testing.md gave the README's word count of an older version (issue 57): it states the limits, which
    are this file's."""
    page = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    assert f"README.md to {FRONT_PAGE_WORDS:,} words at most" in page
    assert f"`make test` within its first {WORDS_BEFORE_THE_COMMANDS}" in page


# ---------------------------------------------------------------------- figures stated in more than one place
def between_1b_saves_min(tokens_per_s: float) -> float:
    """Minutes of training between two saves of the shipped `1b` at `tokens_per_s`."""
    from hf_pretrain.config import load_recipe

    recipe = load_recipe("1b")
    return recipe.checkpoints.save_interval * recipe.train.global_batch_tokens / tokens_per_s / 60


# Each place that states the time between 1b saves, as (minutes, card, tokens/s) it says them.
SAVE_TIME_SENTENCES = {
    "recipes/1b.yaml": [
        r"~(\d+) minutes of one (H100) \(([\d,]+) tokens/s measured\) between checkpoints",
        r"~(\d+) minutes of an (A100) \(([\d,]+) tokens/s\)",
    ],
    "docs/engines.md": [r"~(\d+) min of one (H100) at the measured ([\d,]+) tokens/s"],
    "docs/moving-runs.md": [r"on an (H100) \(~(\d+) min at the measured ([\d,]+) tokens/s\)"],
}


def test_the_time_between_1b_saves_is_the_same_arithmetic_wherever_it_is_stated():
    """~40 min (the recipe), ~28 (docs/engines.md) and ~25 (docs/moving-runs.md) for the same interval (issue 57):
    each is save_interval x global_batch_tokens / the card's measured tokens/s, the H100's being the shipped
    measurement of the 1b (economics/measured.jsonl) and the A100's docs/benchmarks.md's."""
    import json

    shipped = [json.loads(line) for line in (ROOT / "hf_pretrain/economics/measured.jsonl").read_text().splitlines()]
    h100 = next(r["tokens_per_s"] for r in shipped if r["gpu"] == "H100 SXM" and r["configuration"]["compile"])
    a100 = re.search(r"^\| 1b \| A100 80GB SXM \| ([\d,]+) \|", (ROOT / "docs/benchmarks.md").read_text(), re.M)[1]
    measured = {"H100": h100, "A100": float(a100.replace(",", ""))}
    stated = []
    for where, patterns in SAVE_TIME_SENTENCES.items():
        text = " ".join((ROOT / where).read_text().split())
        for pattern in patterns:
            found = re.search(pattern, text)
            assert found, f"{where} no longer says `{pattern}`: the time between saves, and this test, need a look"
            words = found.groups()
            card = next(w for w in words if w in measured)
            minutes, rate = (float(w.replace(",", "")) for w in words if w != card)
            assert rate == measured[card], (
                f"{where}: {rate:,.0f} tokens/s on the {card}, measured {measured[card]:,.0f}"
            )
            assert minutes == round(between_1b_saves_min(rate)), f"{where}: ~{minutes:g} min on the {card}"
            stated.append((card, minutes))
    assert len({m for card, m in stated if card == "H100"}) == 1, stated


def test_the_smoke_recipe_states_the_validation_loss_the_front_page_does():
    """recipes/smoke.yaml said 5.546 at step 250, the README 4.876, today's (issue 57)."""
    front = re.search(r"final train / validation loss\s+([\d.]+) / ([\d.]+)", FRONT_PAGE.read_text())
    recipe = " ".join((ROOT / "recipes" / "smoke.yaml").read_text().replace("#", " ").split())
    today = re.search(r"Today's `make smoke` ends at validation loss ([\d.]+)", recipe)
    assert front and today and today[1] == front[2], (today and today[1], front and front[2])


def test_the_front_page_links_every_page_of_the_guide():
    """ "Where to go next" left out docs/moving-runs.md (issue 45): the front page itself links each page."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(FRONT_PAGE)}
    assert [p.name for p in GUIDE if p.resolve() not in linked] == []


# ---------------------------------------------------------------------- the pictures
def test_the_pictures_are_what_the_run_records_draw_today(tmp_path):
    import numpy as np
    from matplotlib.image import imread

    table = draw(RUN_RECORDS, tmp_path)
    for name in PICTURES:
        committed, drawn = IMAGES / name, tmp_path / name
        assert committed.stat().st_size < 200_000, f"{name} is {committed.stat().st_size:,} bytes"
        a, b = imread(committed), imread(drawn)
        # drawing is deterministic (the same pixels here); a changed label alone moves ~0.2% of them
        differ = a.shape == b.shape and (np.abs(a - b).max(axis=-1) > 0.1).mean()
        assert a.shape == b.shape and differ < 0.001, (
            f"docs/images/{name} is not what the plots draw today: python -m tests.regenerate_docs_images"
        )
    shown = [page for page in PAGES if table in page.read_text()]
    assert shown, "the smoke run's phase table is on no page: python -m tests.regenerate_docs_images prints it"
    for page in shown:
        assert all(f"images/{name}" in page.read_text() for name in PICTURES[:1]), page.name


def test_the_sample_outputs_print_what_the_program_prints_with_no_developers_path():
    """docs/training.md showed `precision no` (the program prints `precision fp32`) and a developer's path (issue 45)."""
    from hf_pretrain.machine.precisions import PRECISIONS

    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            assert "/work/" not in block, f"{page.name}: a developer's path in a sample"
            for shown in re.findall(r"\| precision (\S+)", block):
                assert shown in [p.name for p in PRECISIONS], f"{page.name}: `precision {shown}` is not what it prints"
