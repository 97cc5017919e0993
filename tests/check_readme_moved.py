"""Nothing the old README promised is lost when it became a front page and a guide (issue 35).

Run once, by hand, after the move (not a test: it compares with a past version of the README):

    python tests/check_readme_moved.py 8f0be60          # the commit whose README.md was the long one

It cuts the old README into sentences (paragraphs joined, code blocks line by line) and looks for each
in README.md + docs/*.md of the working tree, after the same normalisation (whitespace, link targets,
`docs/` prefixes: a link that moved into docs/ is the same promise). Every sentence not found verbatim
is then checked atom by atom: its `--flags`, its exit codes and numbers, its `code spans`; what is
still missing is printed. Exit 0 when every atom of every sentence is somewhere in the new text.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLAG = re.compile(r"--[a-z][a-z0-9_-]*")
CODE = re.compile(r"`([^`]+)`")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])")
BOLD = re.compile(r"\*\*([^*]+)\*\*")


def normalise(text: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\(([^)]*)\)", r"\1", text)  # [docs/x.md](docs/x.md) -> docs/x.md
    text = text.replace("docs/", "").replace("../", "")
    text = text.replace("**", "")
    return " ".join(text.split())


def sentences(markdown: str) -> list[str]:
    """Prose cut at sentence ends, code blocks and table rows line by line."""
    out: list[str] = []
    in_code = False
    paragraph: list[str] = []

    def flush() -> None:
        joined = " ".join(" ".join(paragraph).split())
        out.extend(s for s in re.split(r"(?<=[.;:])\s+(?=[A-Z(`*~\"])", joined) if s.strip())
        paragraph.clear()

    for line in markdown.splitlines():
        if line.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code or line.startswith("|"):
            if line.strip():
                out.append(line.strip())
            continue
        if not line.strip() or line.startswith("#"):
            flush()
            if line.startswith("#"):
                out.append(line.lstrip("# ").strip())
            continue
        if line.lstrip().startswith(("- ", "* ")):
            flush()
        paragraph.append(line.lstrip("-* ").strip() if line.lstrip().startswith(("- ", "* ")) else line.strip())
    flush()
    return out


def atoms(sentence: str) -> set[str]:
    found = set(FLAG.findall(sentence))
    found |= {normalise(c) for c in CODE.findall(sentence) if len(c) > 1}
    found |= {b.strip() for b in BOLD.findall(sentence) if b.strip().isdigit()}
    found |= {n for n in NUMBER.findall(re.sub(r"`[^`]*`", " ", sentence)) if len(n.replace(",", "")) > 1}
    return found


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else "8f0be60"
    old = subprocess.run(["git", "show", f"{rev}:README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    new_files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    new_text = normalise("\n".join(p.read_text() for p in new_files))
    new_lines = {normalise(line) for p in new_files for line in p.read_text().splitlines()}

    old_sentences = sentences(old.stdout)
    verbatim = 0
    missing: list[tuple[str, list[str]]] = []
    for sentence in old_sentences:
        plain = normalise(sentence)
        if plain in new_text or plain in new_lines:
            verbatim += 1
            continue
        lost = sorted(a for a in atoms(sentence) if a not in new_text)
        if lost:
            missing.append((sentence, lost))
    reworded = len(old_sentences) - verbatim
    print(f"old README ({rev}): {len(old_sentences)} sentences, code lines and table rows")
    print(f"  found verbatim in README.md + docs/*.md: {verbatim}")
    print(f"  reworded, every flag, exit code, number and code span found: {reworded - len(missing)}")
    print(f"  with something not found: {len(missing)}")
    for sentence, lost in missing:
        print(f"\n- {sentence[:200]}\n  not found: {', '.join(lost)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
