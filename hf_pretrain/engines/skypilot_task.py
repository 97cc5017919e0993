"""The SkyPilot task that rents the plan's cheapest tokens: the shipped task (skypilot/1b.yaml) with its
`resources` asking for the offers `plan --gpu all` ranks cheapest by expected dollars per token, in that order
(`resources.ordered`: SkyPilot tries the first candidate, then the next), spot and on-demand as separate
candidates. Everything else (setup, run, envs, secrets, recovery rules) is the shipped task's text, kept as it
is: one source, so a written task runs what the shipped one runs.

The shipped task is itself written by this module from the catalog snapshot the tests hold
(tests/test_skypilot_plan.py): the file SkyPilot launches from a clone rents what the plan says is cheapest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hf_pretrain.engines.tasks import HERE

SHIPPED_TASK = HERE / "skypilot" / "1b.yaml"
MAX_CANDIDATES = 8  # SkyPilot tries them in turn at each launch and relaunch: more only slows a failing launch
# the `resources` keys that name what to rent; the rest of the block (disk, recovery) is kept as it is
_WHAT_TO_RENT = ("accelerators", "any_of", "ordered", "use_spot", "cloud", "region", "infra")
_ORDERED_NOTE = (
    "  # The offers of SkyPilot's catalog cheapest by expected $ per token for this recipe, spot's preemptions\n"
    "  # priced in (`hf-pretrain plan --recipe RECIPE --gpu all`), tried in this order; SkyPilot takes a\n"
    "  # candidate's cheapest region with capacity. Today's prices: docs/engines.md, \"A task from today's prices\".\n"
)


PLANNED_PRICES = "PLANNED_PRICES"  # `cloud:ACCELERATOR:market=USD` entries, space-separated (engines/skypilot_task.py)


@dataclass(frozen=True)
class PlannedPrice:
    cloud: str
    accelerator: str
    spot: bool
    usd_per_hour: float


def planned_prices(text: str) -> list[PlannedPrice]:
    """`PLANNED_PRICES`'s entries; one that does not read is left out (a hand edit), never a crash."""
    prices = []
    for entry in text.split():
        place, _, price = entry.rpartition("=")
        cloud, _, rest = place.partition(":")
        accelerator, _, market = rest.rpartition(":")
        try:
            usd = float(price)
        except ValueError:
            continue
        if cloud and accelerator and market in ("spot", "on-demand") and usd > 0:
            prices.append(PlannedPrice(cloud.lower(), accelerator, market == "spot", usd))
    return prices


def planned_entry(cloud: str, accelerator: str, spot: bool, usd_per_hour: float) -> str:
    """One `PLANNED_PRICES` entry, as `planned_prices` reads it."""
    return f"{cloud}:{accelerator}:{'spot' if spot else 'on-demand'}={usd_per_hour:g}"


class TaskExists(FileExistsError):
    """`--skypilot_task` names a file that exists: never written over."""


@dataclass(frozen=True)
class Candidate:
    """One machine a task asks SkyPilot for: `gpus` cards named `accelerator` (the catalog's spelling) on
    `cloud`, spot or on-demand; `note` says why it is there (the plan's figures)."""

    cloud: str
    accelerator: str
    gpus: int
    spot: bool
    price_per_hour: float
    note: str = ""


def candidate_line(candidate: Candidate) -> str:
    """One `resources.ordered` entry, its note beside it."""
    spot = "true" if candidate.spot else "false"
    entry = f'{{cloud: {candidate.cloud}, accelerators: "{candidate.accelerator}:{candidate.gpus}", use_spot: {spot}}}'
    return f"    - {entry}" + (f"  # {candidate.note}" if candidate.note else "") + "\n"


def resources_with(block: str, candidates: list[Candidate]) -> str:
    """The `resources:` block `block` with what it rents replaced by `candidates` as `ordered`, the rest (disk,
    recovery, their comments) kept where it was."""
    if not candidates:
        raise ValueError("no offer fits the recipe: nothing to rent")
    lines = block.replace(_ORDERED_NOTE, "").splitlines(keepends=True)  # a written task's own note goes too
    kept, dropping, inserted = [lines[0]], False, False
    for line in lines[1:]:
        key = re.match(r"^  (\w+):", line)
        if key:  # a key of the block: keep it unless it names what to rent
            dropping = key[1] in _WHAT_TO_RENT
        elif dropping and (line.startswith("   ") or not line.strip()):
            continue  # the dropped key's own lines (its list, its comments)
        else:
            dropping = False
        if dropping:
            if not inserted:
                kept += [_ORDERED_NOTE, "  ordered:\n", *(candidate_line(c) for c in candidates)]
                inserted = True
            continue
        kept.append(line)
    if not inserted:
        kept += [_ORDERED_NOTE, "  ordered:\n", *(candidate_line(c) for c in candidates)]
    return "".join(kept)


def with_planned_prices(base: str, candidates: list[Candidate]) -> str:
    """`base` with its `envs` holding the candidates' prices (PLANNED_PRICES): the pod check prices the machine
    SkyPilot rented at the plan's price of that offer (check/pod_price.py)."""
    entries = " ".join(planned_entry(c.cloud, c.accelerator, c.spot, c.price_per_hour) for c in candidates)
    line = f'  {PLANNED_PRICES}: "{entries}"  # written by plan: what the pod check prices this machine at\n'
    base = re.sub(rf"^  {PLANNED_PRICES}: .*\n", "", base, flags=re.M)
    if not re.search(r"^envs:\n", base, flags=re.M):
        raise ValueError("the task has no top-level `envs:` block")
    return re.sub(r"^envs:\n", lambda m: m[0] + line, base, count=1, flags=re.M)


def task_text(base: str, candidates: list[Candidate], header: str = "") -> str:
    """`base` (a task's text) renting `candidates`, their prices in its envs, `header` (comment lines) on top."""
    base = with_planned_prices(base, candidates)
    match = re.search(r"^resources:\n(?:(?:[ #].*)?\n)*", base, flags=re.M)
    if match is None:
        raise ValueError("the task has no top-level `resources:` block")
    block = match.group(0)
    tail = ""
    while block.endswith("\n\n"):  # the blank lines after the block stay after it
        block, tail = block[:-1], tail + "\n"
    text = base[: match.start()] + resources_with(block, candidates) + tail + base[match.end() :]
    return header + text


def write_task(path: Path, text: str) -> None:
    """Write `text` to `path`, which must not exist (O_EXCL: not even a file another process made meanwhile)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise TaskExists(
            f"{path} exists and is never written over; fix: give another path, or remove it first (rm {path})"
        ) from None
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def planned_task(recipe_name: str, candidates: list[Candidate], source: str, when: str, base: str | None = None) -> str:
    """The shipped task for `recipe_name` renting `candidates`, with a header saying which plan, from which
    prices and when. Recipe keys given to `plan` on top of the recipe are not in the task: TRAIN_ARGS carries them."""
    base = SHIPPED_TASK.read_text() if base is None else base
    base = re.sub(r"^name: .*$", f"name: hf-pretrain-{_slug(recipe_name)}", base, count=1, flags=re.M)
    base = re.sub(r"^(  RECIPE: ).*$", lambda m: m[1] + recipe_name, base, count=1, flags=re.M)
    header = (
        f"# Written by `hf-pretrain plan --recipe {recipe_name} --gpu all --skypilot_task ...` on {when} from {source}.\n"
        f"# It rents the offers that were cheapest by expected $ per token that day; write it again when prices\n"
        f"# move. Recipe keys given to plan on top of the recipe go in TRAIN_ARGS (`--env TRAIN_ARGS=...`).\n"
        f"#\n"
    )
    return task_text(base, candidates, header)


def _slug(name: str) -> str:
    """A task name SkyPilot accepts from a recipe name or path: `recipes/my run.yaml` -> `my-run`."""
    stem = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    return re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-") or "run"
