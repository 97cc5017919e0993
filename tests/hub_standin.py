"""A stand-in for the Hugging Face Hub API on loopback, for upload tests that never leave the machine.

It implements only what `huggingface_hub` 2.4 calls to create a model or Space repo, a branch, and a
commit of small files, and to download them again: `POST /api/repos/create`, `POST /api/validate-yaml`
(a Space's README front matter), and for `{kind}` = `models` or `spaces`:
`POST /api/{kind}/{repo}/preupload/{rev}` (every file answers `regular`, so the client sends it
base64 inside the commit instead of through LFS or Xet), `POST /api/{kind}/{repo}/commit/{rev}`
(NDJSON), `POST /api/{kind}/{repo}/branch/{name}`, `GET /api/{kind}/{repo}/revision/{rev}`,
`GET /api/{kind}/{repo}/tree/{rev}`, `HEAD`/`GET /[spaces/]{repo}/resolve/{rev}/{path}` and
`GET /api/whoami-v2` (a user whose token writes, or only reads under `refuse_writes`).
Anything else answers 404 and is kept in `unexpected`, so a test sees a new call.

Point the real client at it with `HF_ENDPOINT=<stand-in url>`. Requests must carry `token` as a
Bearer token. With `refuse_writes` set, every write answers 403 with a message that repeats the
token, the worst case a client's error scrubbing has to handle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class Branch:
    commit: str
    files: dict[str, bytes]


@dataclass
class Repo:
    private: bool
    branches: dict[str, Branch]


@dataclass
class HubState:
    token: str
    refuse_writes: bool = False
    repos: dict[str, Repo] = field(default_factory=dict)  # by repo id; Spaces as "spaces/{repo id}"
    requests: list[str] = field(default_factory=list)  # "METHOD path", in arrival order
    created: list[dict] = field(default_factory=list)  # the payloads of repo creations
    commits: list[dict] = field(default_factory=list)  # {"repo", "summary", "files": {path: bytes}} of each commit
    authorization: list[str] = field(default_factory=list)  # the Authorization header of every request
    unexpected: list[str] = field(default_factory=list)  # requests for endpoints the stand-in does not have
    # A slow Hub: each commit answers after `commit_delay` seconds. `watch`, when set, is sampled as a
    # commit arrives and again as it is answered, into `watched` as (revision, on arrival, on answer).
    commit_delay: float = 0.0
    watch: Callable[[], Any] | None = None
    watched: list[tuple[str, Any, Any]] = field(default_factory=list)


# URL segment -> key prefix in `HubState.repos`
KINDS = {"models": "", "spaces": "spaces/"}


def _commit_id(parent: str, payload: bytes) -> str:
    return hashlib.sha1(parent.encode() + payload).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    state: HubState  # set on the subclass made per server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    # ------------------------------------------------------------------ plumbing
    def _reply(
        self,
        status: int,
        body: bytes | dict | list = b"",
        headers: dict[str, str] | None = None,
        head_only: bool = False,
    ) -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
        self._reply(status, {"error": message}, headers)

    def _unexpected(self) -> None:
        self.state.unexpected.append(f"{self.command} {urlsplit(self.path).path}")
        self._error(404, f"no such endpoint: {self.command} {self.path}")

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorized(self) -> bool:
        self.state.authorization.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != f"Bearer {self.state.token}":
            self._error(401, "Invalid credentials in Authorization header")
            return False
        return True

    def _refused(self) -> bool:
        if self.state.refuse_writes:
            self._error(403, f"You don't have the rights to write here (token {self.state.token} is read-only)")
            return True
        return False

    def _route(self) -> tuple[list[str], dict[str, str]]:
        url = urlsplit(self.path)
        self.state.requests.append(f"{self.command} {url.path}")
        params = dict(p.split("=", 1) for p in url.query.split("&") if "=" in p)
        return [unquote(part) for part in url.path.strip("/").split("/")], params

    def _branch(self, repo_id: str, revision: str) -> Branch | None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            self._error(404, f"Repository {repo_id} not found", "RepoNotFound")
            return None
        # a branch name, or the commit a branch points at (downloads pin the commit they resolved)
        found = repo.branches.get(revision) or next((b for b in repo.branches.values() if b.commit == revision), None)
        if found is None:
            self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return found

    # ------------------------------------------------------------------ verbs
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        parts, _ = self._route()
        body = self._body()
        if not self._authorized():
            return
        if parts == ["api", "validate-yaml"]:
            return self._reply(200, {"errors": [], "warnings": []})
        if self._refused():
            return
        if parts == ["api", "repos", "create"]:
            return self._create_repo(json.loads(body))
        if len(parts) == 6 and parts[0] == "api" and parts[1] in KINDS:
            repo_id, action, name = f"{KINDS[parts[1]]}{parts[2]}/{parts[3]}", parts[4], parts[5]
            if action == "preupload":
                return self._preupload(repo_id, name, json.loads(body))
            if action == "commit":
                return self._commit(repo_id, name, body)
            if action == "branch":
                return self._create_branch(repo_id, name)
        self._unexpected()

    def do_GET(self) -> None:  # noqa: N802
        self._read(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._read(head_only=True)

    def _read(self, head_only: bool) -> None:
        parts, _ = self._route()
        if not self._authorized():
            return
        if parts == ["api", "whoami-v2"]:  # who the token is, and what it may do
            role = "read" if self.state.refuse_writes else "write"
            return self._reply(200, {"type": "user", "name": "user", "auth": {"accessToken": {"role": role}}})
        if len(parts) == 6 and parts[0] == "api" and parts[1] in KINDS and parts[4] in ("revision", "tree"):
            repo_id = f"{KINDS[parts[1]]}{parts[2]}/{parts[3]}"
            branch = self._branch(repo_id, parts[5])
            if branch is None:
                return
            if parts[4] == "revision":
                return self._reply(
                    200,
                    {
                        "id": repo_id,
                        "sha": branch.commit,
                        "private": self.state.repos[repo_id].private,
                        "siblings": [{"rfilename": p} for p in sorted(branch.files)],
                    },
                )
            return self._reply(
                200,
                [
                    {"type": "file", "path": p, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for p, data in sorted(branch.files.items())
                ],
            )
        prefix = "spaces/" if parts[0] == "spaces" else ""
        parts = parts[1:] if prefix else parts
        if len(parts) >= 5 and parts[2] == "resolve":
            branch = self._branch(f"{prefix}{parts[0]}/{parts[1]}", parts[3])
            if branch is None:
                return
            data = branch.files.get("/".join(parts[4:]))
            if data is None:
                return self._error(404, "Entry not found", "EntryNotFound")
            headers = {"X-Repo-Commit": branch.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
            self.send_response(200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head_only:
                self.wfile.write(data)
            return
        self._unexpected()

    # ------------------------------------------------------------------ endpoints
    def _create_repo(self, payload: dict) -> None:
        self.state.created.append(payload)
        prefix = "spaces/" if payload.get("type") == "space" else ""
        repo_id = f"{prefix}{payload.get('organization') or 'user'}/{payload['name']}"
        url = f"http://{self.headers['Host']}/{repo_id}"
        if repo_id in self.state.repos:  # the Hub's 409 names the existing repo, which the client reads
            message = "You already created this model repo"
            return self._reply(409, {"error": message, "url": url}, {"X-Error-Message": message})
        initial = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
        main = Branch(_commit_id("", initial), {".gitattributes": initial})
        self.state.repos[repo_id] = Repo(payload.get("visibility") == "private", {"main": main})
        self._reply(200, {"url": url})

    def _create_branch(self, repo_id: str, name: str) -> None:
        main = self._branch(repo_id, "main")
        if main is None:
            return
        branches = self.state.repos[repo_id].branches
        if name in branches:
            return self._error(409, f"Branch {name} already exists")
        branches[name] = Branch(main.commit, dict(main.files))
        self._reply(200, {})

    def _preupload(self, repo_id: str, revision: str, payload: dict) -> None:
        if self._branch(repo_id, revision) is None:
            return
        self._reply(
            200,
            {
                "files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                    for f in payload["files"]
                ]
            },
        )

    def _commit(self, repo_id: str, revision: str, body: bytes) -> None:
        arrival = self.state.watch() if self.state.watch else None
        time.sleep(self.state.commit_delay)
        if self.state.watch:
            self.state.watched.append((revision, arrival, self.state.watch()))
        branch = self._branch(repo_id, revision)
        if branch is None:
            return
        files, summary = {}, ""
        for line in body.splitlines():
            entry = json.loads(line)
            if entry["key"] == "header":
                summary = entry["value"].get("summary", "")
            elif entry["key"] == "file":
                value = entry["value"]
                files[value["path"]] = branch.files[value["path"]] = base64.b64decode(value["content"])
            elif entry["key"] == "deletedFile":
                branch.files.pop(entry["value"]["path"], None)
            else:  # lfsFile, copies: this stand-in never asks for them
                return self._error(400, f"unsupported commit entry {entry['key']}")
        branch.commit = _commit_id(branch.commit, body)
        self.state.commits.append({"repo": repo_id.removeprefix("spaces/"), "summary": summary, "files": files})
        host = self.headers["Host"]
        self._reply(
            200,
            {
                "commitUrl": f"http://{host}/{repo_id}/commit/{branch.commit}",
                "commitOid": branch.commit,
                "pullRequestUrl": None,
            },
        )


class HubStandIn:
    """`with HubStandIn(token) as hub:` serves on `hub.url` until the block ends."""

    def __init__(self, token: str):
        self.state = HubState(token=token)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo_id: str, branch: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        return self.state.repos[("spaces/" if repo_type == "space" else "") + repo_id].branches[branch].files
