"""A JSON file written whole or not at all: the one way the package writes a file another process may
read while it changes (status.json, a stop request, a watchdog report, prepare's records).

The text goes to a temporary file beside the target, named for this process (two writers may race;
neither sees the other's half), and `os.replace` puts it in place: a reader finds the old file or the
new one, never half of either. On an OSError (a full disk, a read-only folder) the temporary file is
removed and the error raised: each caller decides what a failed write means for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, payload: Any, indent: int | None = 1) -> None:
    """`payload` as JSON (and a newline) in `path`, whole or not at all; raises OSError, leaving no temporary file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=indent) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
