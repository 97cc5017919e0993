"""lm-eval's lines that say nothing to a user of `hf-pretrain eval`, kept off the screen while it runs.

- Its HF model warns on every run that `pretrained` is a model object, not a name, and that it assumes one
  process: this command always hands it the model it loaded, in one process, on purpose.
- Its results record the git commit of the working directory through `git describe`, whose
  "fatal: not a git repository" reaches the terminal from any folder that is not a checkout; the same
  command is asked here with its complaint silenced (a checkout's hash is still recorded).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from unittest import mock

# the starts of lm-eval's warnings about the model object this command passes on purpose
MODEL_OBJECT_WARNINGS = (
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model through `pretrained`",
)


class _DropModelObjectWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(MODEL_OBJECT_WARNINGS)


def quiet_git_commit_hash() -> str | None:
    """lm-eval's `get_git_commit_hash` without git's complaint outside a checkout: None there."""
    try:
        found = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)
    except OSError:  # no git on this machine
        return None
    return found.stdout.strip() or None


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    import lm_eval.evaluator

    logger = logging.getLogger("lm_eval.models.huggingface")
    dropping = _DropModelObjectWarnings()
    logger.addFilter(dropping)
    try:
        with mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", quiet_git_commit_hash):
            yield
    finally:
        logger.removeFilter(dropping)
