"""What a part of the check says, as it measures: a line on the screen for people and a JSON line in the
results file for the verdict and the measurement store, written and flushed figure by figure, so a part
cut at its limit keeps everything it measured before."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    part: str
    name: str
    value: float | None  # None: skipped or failed, `text` says why
    unit: str = ""
    text: str = ""  # the line people read
    device: str | None = None  # the CUDA name, None on a CPU
    detail: dict[str, Any] = field(default_factory=dict)


class Report:
    """A part's voice: `figure` for a measurement, `skip` for a one-line reason; both print and append."""

    def __init__(self, part: str, results: Path, device: str | None, say=print) -> None:
        self.part, self.results, self.device, self.say = part, results, device, say

    def _write(self, figure: Figure, quiet: bool = False) -> None:
        with self.results.open("a") as file:
            file.write(json.dumps(asdict(figure)) + "\n")
            file.flush()
        if not quiet:
            self.say(f"  {figure.text}")

    def figure(self, name: str, value: float, unit: str, text: str, quiet: bool = False, **detail: Any) -> None:
        """A measurement; `quiet`: written, not said (a running figure the next one replaces; the check
        says it only if the part is cut before the last)."""
        self._write(Figure(self.part, name, float(value), unit, text, self.device, detail), quiet)

    def skip(self, name: str, reason: str, **detail: Any) -> None:
        self._write(Figure(self.part, name, None, "", f"{name}: {reason}", self.device, detail))


def read_figures(results: Path) -> list[Figure]:
    """Every figure the parts wrote; where a part wrote one name several times (a step's running rate,
    updated after each timed step), the last one."""
    latest: dict[tuple[str, str], Figure] = {}
    try:
        lines = results.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            figure = Figure(**json.loads(line))
        except (ValueError, TypeError):  # the torn last line of a part killed mid-write
            continue
        latest.pop((figure.part, figure.name), None)
        latest[(figure.part, figure.name)] = figure
    return list(latest.values())
