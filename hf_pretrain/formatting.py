"""How numbers and text are written for people: counts, bytes, durations, dollars, table cells.

One home, so the plan, the bench, the report, the model card and the doctor print a billion
tokens, a gigabyte or an hour the same way. (publish/space_template/app.py keeps its own few
lines on purpose: it runs in a Space where hf-pretrain is not installed.)
"""

from __future__ import annotations

import html
import re


def human_count(x: float) -> str:
    """1.04B, 350M, 205K: parameters and tokens the way people say them (three significant digits)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def human_bytes(n_bytes: float) -> str:
    """Decimal units (GB, MB), the ones disks and GPU data sheets are sold in."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:,.1f} {unit}"
    return f"{n_bytes / 1e3:,.1f} kB"


def human_duration(seconds: float) -> str:
    """`45.0 s`, `12.5 min`, `3.20 h`: the unit that keeps the number short."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def usd(amount: float) -> str:
    """`$1,234.56`."""
    return f"${amount:,.2f}"


def table_cell(text: str) -> str:
    """Text that stays inside one markdown table cell and shows as written: HTML and markdown escapes,
    pipes escaped, line breaks (runs of blank lines as one) as `<br>`, an empty text marked as such."""
    text = html.escape(text.replace("\r", "").strip(), quote=False)
    if not text:
        return "*(blank)*"
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return re.sub(r"\n\s*", "<br>", text)


def formatted(value: float | None, spec: str) -> str:
    """`format(value, spec)`, or `n/a` for a value that was not measured."""
    return "n/a" if value is None else format(value, spec)
