"""`push_to_hub`: whether the run will be able to push, said before it trains.

A warning, never a refusal: what a run pushes (final/, and with `push_checkpoints` each checkpoint)
is complete on the local disk whether or not the push happens, and pushing it later is one command.
Refusing would cost a queue slot or a rented GPU for something a login fixes in a minute, and a run
on a cluster without network is a fair way to train. So the doctor says what it finds (offline mode,
no token, a token the Hub refuses or that only reads, a Hub that does not answer), the run trains,
and its last line and status.json name what was not pushed (publish/side_jobs.py).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from huggingface_hub import HfApi, constants, get_token

from hf_pretrain.config import PublishConfig
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.redaction import redact

WHOAMI_TIMEOUT_S = 10.0


def check_hub(publish: PublishConfig, *, output_dir: str, timeout: float = WHOAMI_TIMEOUT_S) -> CheckResult:
    """`output_dir`: the run's, where final/ is, named in the command that pushes it later."""
    repo = publish.push_to_hub
    if not repo:
        return CheckResult("hub", "skip", "push_to_hub is not set: nothing is pushed")
    if os.environ.get("RANK", "0") != "0":
        return CheckResult("hub", "skip", "the job's first process pushes")
    later = f"or push after the run with `hf upload {repo} {output_dir}/final`"
    nothing = "nothing will be pushed (the run trains, and its end names what was not pushed)"
    if constants.is_offline_mode():
        return CheckResult(
            "hub", "warn", f"push_to_hub={repo} but HF_HUB_OFFLINE is set: {nothing}", f"unset HF_HUB_OFFLINE, {later}"
        )
    token = get_token()
    if token is None:
        return CheckResult(
            "hub",
            "warn",
            f"push_to_hub={repo} but no Hub token is found (HF_TOKEN, `hf auth login`): {nothing}",
            f"`hf auth login` with a write token (or set HF_TOKEN), {later}",
        )
    answer, failure = _whoami(token, timeout)
    if failure is not None:
        return CheckResult("hub", "warn", f"push_to_hub={repo}: {redact(failure, held=[token])}: {nothing}", later)
    role = (answer.get("auth") or {}).get("accessToken", {}).get("role")
    if role == "read":
        return CheckResult(
            "hub",
            "warn",
            f"push_to_hub={repo}: the token of {answer.get('name')} can only read: {nothing}",
            f"`hf auth login` with a write token, {later}",
        )
    return CheckResult("hub", "pass", f"{constants.ENDPOINT} answers; pushes to {repo} as {answer.get('name')}")


def _whoami(token: str, timeout: float) -> tuple[dict[str, Any], str | None]:
    """The Hub's answer to who the token is, or why there is none; never waits more than `timeout`
    (a cluster's firewall can swallow a connection without a reply)."""
    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            result["answer"] = HfApi(token=token).whoami()
        except Exception as exc:  # noqa: BLE001 - every failure is a reason to tell
            status = getattr(getattr(exc, "response", None), "status_code", None)
            result["failure"] = (
                f"{constants.ENDPOINT} refused the token (HTTP 401)"
                if status == 401
                else f"cannot reach {constants.ENDPOINT} ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})"
            )

    asking = threading.Thread(target=ask, daemon=True, name="hf-pretrain-whoami")  # abandoned if it hangs
    asking.start()
    asking.join(timeout)
    if asking.is_alive():
        return {}, f"{constants.ENDPOINT} did not answer within {timeout:.0f} s"
    return result.get("answer", {}), result.get("failure")
