"""A Hub repository's files on this machine, through huggingface_hub and its cache, or one line saying why not.

Everything that reads a published model or tokenizer by its Hub id (`init_from`, a `tokenizer` that is
not a local folder) comes here: the files land in huggingface_hub's cache (`HF_HUB_CACHE`), and with
`HF_HUB_OFFLINE=1` only the cache is read. A local folder never comes here.
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

# What a tokenizer needs (config.json: some name their tokenizer class only there).
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "config.json",
]
# A snapshot in the cache: HF_HUB_CACHE/models--ORG--NAME/snapshots/COMMIT/
_CACHED_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


class HubFilesError(ValueError):
    """A Hub id whose files cannot be had here: `reason` names the id, `fix` says what to do."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


def is_hub_id(name: str) -> bool:
    """`org/name` (or `name`) as the Hub spells repository ids; a path like `./x`, `/x` or `a/b/c` is not."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_id_of_folder(folder: str | Path) -> str | None:
    """The Hub id of a snapshot folder in huggingface_hub's cache (`.../models--org--name/snapshots/sha`)."""
    found = _CACHED_SNAPSHOT.search(Path(folder).as_posix())
    return f"{found['org']}/{found['name']}" if found else None


def hub_snapshot(repo_id: str, patterns: list[str], what: str = "model") -> Path:
    """The local snapshot folder of `repo_id`'s files matching `patterns`, downloaded into the cache when
    they are not there yet (and the Hub may be reached). Raises `HubFilesError` saying why not."""
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except LocalEntryNotFoundError as exc:  # offline, or the Hub unreachable, and not (all) in the cache
        if constants.HF_HUB_OFFLINE:
            raise HubFilesError(
                f"{what} {repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"HF_HUB_OFFLINE=1 forbids downloading it",
                f"download it once where the Hub can be reached (`hf download {repo_id}`), or name a local folder",
            ) from None
        cause = exc.__cause__ or exc  # what stopped the download (a ConnectError, ...), said in its first line
        raise HubFilesError(
            f"{what} {repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and could not be "
            f"downloaded ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else 'no detail'})",
            "check the connection and try again, or name a local folder",
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise HubFilesError(
            f"{what} {repo_id}: no such repository on the Hub, or it is private or gated and this machine's "
            f"token has no access to it",
            "check the id, or `hf auth login` with a token that has access",
        ) from None
    except RevisionNotFoundError as exc:
        raise HubFilesError(f"{what} {repo_id}: {exc}", "check the revision") from None
    except HfHubHTTPError as exc:
        raise HubFilesError(f"{what} {repo_id}: the Hub answered {exc}", "try again, or name a local folder") from None
