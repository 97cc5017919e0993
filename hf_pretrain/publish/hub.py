"""Uploads to the Hugging Face Hub: create the repo if needed, a branch when asked, upload a folder.

The one upload path: exports, checkpoints, final models and Spaces all go through `push_folder`.

huggingface_hub finds the token itself (the `HF_TOKEN` variable, else the `hf auth login` file)
and sends it to `HF_ENDPOINT` (the Hub unless set otherwise). We never print it: every error
leaves this module as a `HubError` whose message is redacted (hf_pretrain/redaction.py: the token, and
anything shaped like one), so neither a log nor a traceback can carry it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from huggingface_hub import HfApi, constants, get_token

from hf_pretrain.redaction import redact


class HubError(RuntimeError):
    """An upload that did not happen, with a message that is safe to print."""


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload model exported with hf-pretrain",
    repo_type: str = "model",
    space_sdk: str | None = None,
    ignore: list[str] | None = None,
) -> str:
    """Upload every file in `folder` to the repo `repo_id` of `repo_type` (`model`, or `space` with its
    `space_sdk`), created when missing (private=None: the account's default visibility), on branch
    `revision` (created from main when missing; None = main); files matching `ignore` stay here.
    Returns the commit URL."""
    if constants.is_offline_mode():
        raise HubError(
            f"cannot push to {repo_id}: HF_HUB_OFFLINE is set, so huggingface_hub makes no network "
            f"calls; unset it and push again"
        )
    token = get_token()
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True, space_sdk=space_sdk)
        if revision:
            api.create_branch(repo_id, branch=revision, repo_type=repo_type, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type=repo_type,
            revision=revision,
            commit_message=commit_message,
            ignore_patterns=ignore,
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes one redacted message
        # the token itself (from HF_TOKEN or the login file), and anything shaped like one: redaction.py's rules
        reason = redact(f"{type(exc).__name__}: {exc}", held=[token])
        hint = "" if token else " (no token found: set HF_TOKEN or run `hf auth login`)"
        where = f"{constants.ENDPOINT}/{'spaces/' if repo_type == 'space' else ''}{repo_id}"
        # `from None`: the original exception (and any token in its text) must not reach a traceback
        raise HubError(f"upload of {folder} to {where} failed{hint}: {reason}") from None
    return commit.commit_url


def push_or_explain(
    folder: str | Path, repo_id: str, *, prog: str, what: str, rerun_hint: str = "", **options
) -> str | None:
    """`push_folder(folder, repo_id, **options)` for a command line: the commit URL, or None after
    printing why it failed (token-free) and the `hf upload` command that pushes the finished `what` later."""
    try:
        return push_folder(folder, repo_id, **options)
    except HubError as exc:
        later = f"hf upload {repo_id} {folder}"
        if options.get("repo_type", "model") != "model":
            later += f" --repo-type {options['repo_type']}"
        if options.get("revision"):
            later += f" --revision {options['revision']}"
        print(
            f"{prog}: error: {exc}\nThe {what} in {folder} is complete: push it later with `{later}`{rerun_hint}.",
            file=sys.stderr,
        )
        return None
