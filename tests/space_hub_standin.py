"""A loopback stand-in for the few Hub API endpoints that pushing a Space calls.

huggingface_hub 2.4's `create_repo(repo_type="space")` + `upload_folder` make these requests:
  POST /api/repos/create                           {"name", "organization", "type": "space", "sdk", ...}
  POST /api/validate-yaml                          the README.md front matter, before anything is uploaded
  POST /api/spaces/{namespace}/{name}/preupload/{revision}   how to upload each file; all answered
                                                             "regular", so no LFS or Xet transfer follows
  POST /api/spaces/{namespace}/{name}/commit/{revision}      NDJSON: a header line, then one line per file
                                                             with its content in base64
Anything else is answered 404 and kept in `unexpected`, so a test sees a new call.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPO = r"/api/spaces/(?P<repo>[^/]+/[^/]+)"


@dataclass
class HubRecord:
    """What the stand-in was asked to do."""

    created: list[dict[str, Any]] = field(default_factory=list)
    authorization: list[str] = field(default_factory=list)
    commits: list[dict[str, Any]] = field(default_factory=list)  # {"repo", "summary", "files": {path: bytes}}
    unexpected: list[str] = field(default_factory=list)


class SpaceHubStandin:
    """`with SpaceHubStandin() as hub:` serves on 127.0.0.1 at `hub.url` until the block ends."""

    def __init__(self) -> None:
        self.record = HubRecord()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SpaceHubStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        record, url = self.record, lambda: self.url

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep the test output clean
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                record.unexpected.append(f"GET {self.path}")
                self._reply(404, {"error": f"not in the stand-in: GET {self.path}"})

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                record.authorization.append(self.headers.get("Authorization", ""))
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    record.created.append(payload)
                    self._reply(200, {"url": f"{url()}/spaces/{payload['organization']}/{payload['name']}"})
                elif path == "/api/validate-yaml":
                    self._reply(200, {"errors": [], "warnings": []})
                elif match := re.fullmatch(REPO + r"/preupload/[^/]+", path):
                    files = json.loads(body)["files"]
                    self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                                 "oid": None} for f in files]})
                elif match := re.fullmatch(REPO + r"/commit/[^/]+", path):
                    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                    header = next(line["value"] for line in lines if line["key"] == "header")
                    files = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
                             for line in lines if line["key"] == "file"}
                    record.commits.append({"repo": match["repo"], "summary": header["summary"], "files": files})
                    oid = f"{len(record.commits):040x}"
                    self._reply(200, {"commitUrl": f"{url()}/spaces/{match['repo']}/commit/{oid}",
                                      "commitOid": oid, "pullRequestUrl": None})
                else:
                    record.unexpected.append(f"POST {path}")
                    self._reply(404, {"error": f"not in the stand-in: POST {path}"})

        return Handler
