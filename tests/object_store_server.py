"""An S3-compatible server on localhost for the object-store tests: moto's server mode, offline.

moto serves the S3 API in a thread of the test process; subprocesses (a trainer, `prepare`) reach it
over TCP like any store. Between them sits a proxy the tests can cut and restore, so "the store's
server stopped mid-upload and restarted" keeps the buckets (moto holds them in memory) while every
client sees refused and reset connections, as it would of a real outage.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

FAKE_KEY_ID = "AKIAHFPRETRAINTESTKEY"
# recognisable, so a test can prove it never appears in a log, status.json, metrics or an export
FAKE_SECRET = "hfPretrainFakeSecret/DoNotPrintMe0123456789"


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>proxy</RequestId></Error>"
)


class CuttableProxy:
    """A TCP proxy from a local port to the server; `cut()` drops every connection and refuses new ones,
    `stall()` makes the store a black hole (connections accepted, bytes read, nothing ever answered),
    `throttle(share)` answers that share of requests `503 SlowDown` as S3 does under load."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._stalled = threading.Event()
        self.throttle_share = 0.0
        self.throttled = 0  # how many requests were answered 503 SlowDown
        self._rng = random.Random(0)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """The server is gone: close what is open, refuse (reset) what comes next."""
        self._open.clear()
        with self._lock:
            for conn in self._connections:
                _close(conn)
            self._connections.clear()

    def restore(self) -> None:
        """The store answers again; a connection caught in a stall is closed (half a request went nowhere)."""
        if self._stalled.is_set():
            self._stalled.clear()
            self._drop_connections()
        self._open.set()

    def stall(self) -> None:
        """A black hole: every open connection and every new one is read from and never answered."""
        self._stalled.set()

    def throttle(self, share: float) -> None:
        """From now on, `share` of the requests of new connections are answered 503 SlowDown (open ones
        are closed, so that clients reconnect through the throttle)."""
        self.throttle_share = share
        self._drop_connections()

    def _drop_connections(self) -> None:
        with self._lock:
            for conn in self._connections:
                _close(conn)
            self._connections.clear()

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if not self._open.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                _close(client)  # linger 0: a reset, as a stopped server's port answers
                continue
            if self._stalled.is_set():
                with self._lock:
                    self._connections.append(client)
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._connections += [client, upstream]
            requests = self._throttled_requests if self.throttle_share else self._pipe
            threading.Thread(target=requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while self._open.is_set() and (chunk := source.recv(1 << 16)):
                if not self._stalled.is_set():  # a black hole: read, never passed on
                    sink.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)

    def _swallow(self, client: socket.socket) -> None:
        try:
            while client.recv(1 << 16):
                pass
        except OSError:
            pass

    def _throttled_requests(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to server one HTTP request at a time (clients send the next only after the answer):
        a share answered 503 SlowDown here, the rest passed on whole."""
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = client.recv(1 << 16)
                    if not chunk:
                        return
                    buffer += chunk
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
                fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
                length = int(fields.get(b"content-length", b"0"))
                waits_for_continue = fields.get(b"expect", b"").lower() == b"100-continue"
                if self._rng.random() < self.throttle_share:
                    self.throttled += 1
                    answer = b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                    if waits_for_continue:  # its body never comes: the connection ends with the answer
                        client.sendall(
                            answer + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(SLOW_DOWN) + SLOW_DOWN
                        )
                        return
                    while len(buffer) < length:
                        chunk = client.recv(1 << 16)
                        if not chunk:
                            return
                        buffer += chunk
                    buffer = buffer[length:]
                    client.sendall(answer + b"Content-Length: %d\r\n\r\n" % len(SLOW_DOWN) + SLOW_DOWN)
                    continue
                upstream.sendall(head + b"\r\n\r\n")
                sent = 0
                while sent < length:
                    if not buffer:
                        buffer = client.recv(1 << 16)
                        if not buffer:
                            return
                    part, buffer = buffer[: length - sent], buffer[length - sent :]
                    upstream.sendall(part)
                    sent += len(part)
        except OSError:
            pass
        finally:
            _close(client)
            _close(upstream)


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass


class S3Server:
    """A running moto server behind a cuttable proxy; `env` is what a client process needs to reach it."""

    def __init__(self, proxy: CuttableProxy):
        self.proxy = proxy
        self.endpoint = f"http://127.0.0.1:{proxy.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def make_bucket(self, name: str) -> str:
        """Create `name` and return its URL, `s3://name`."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, **_credentials()).create_bucket(Bucket=name)
        return f"s3://{name}"


def _credentials() -> dict[str, str]:
    return {"aws_access_key_id": FAKE_KEY_ID, "aws_secret_access_key": FAKE_SECRET, "region_name": "us-east-1"}


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield S3Server(CuttableProxy(server.get_host_and_port()))
    finally:
        server.stop()


# ---------------------------------------------------------------------------------- a store that checks keys
READ_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket", "s3:HeadBucket"], "Resource": "*"}],
}
READ_WRITE_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


class AuthenticatingS3Server:
    """A moto server in a process of its own that checks every request's key and the IAM policy of its
    user, as a real store does (moto's `INITIAL_NO_AUTH_ACTION_COUNT` is process-wide, so the shared
    fixture's server stays open). `writer` and `reader` are (key id, secret) of two IAM users: one may
    do anything, the other only read; `bucket` exists."""

    def __init__(self, endpoint: str, writer: tuple[str, str], reader: tuple[str, str], bucket: str):
        self.endpoint, self.writer, self.reader, self.bucket = endpoint, writer, reader, bucket

    def env(self, key: tuple[str, str]) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key[0],
            "AWS_SECRET_ACCESS_KEY": key[1],
            "AWS_DEFAULT_REGION": "us-east-1",
        }


@contextmanager
def running_authenticating_s3_server(check_keys: bool = True) -> Iterator[AuthenticatingS3Server]:
    """See `AuthenticatingS3Server`; without `check_keys`, a plain moto server in a process of its own
    (benchmarks/bench_store.py: a store that does not share the trainer's interpreter)."""
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the authenticating moto server did not start") from None
                time.sleep(0.2)
        # set up while moto still lets every request through, then make it check keys from here on
        iam = boto3.client("iam", endpoint_url=endpoint, **_credentials())
        keys = {}
        for user, policy in (("writer", READ_WRITE_POLICY), ("reader", READ_ONLY_POLICY)):
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        boto3.client("s3", endpoint_url=endpoint, **_credentials()).create_bucket(Bucket="guarded")
        if not check_keys:
            yield AuthenticatingS3Server(endpoint, keys["writer"], keys["reader"], "s3://guarded")
            return
        request = urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(request, timeout=10)
        yield AuthenticatingS3Server(endpoint, keys["writer"], keys["reader"], "s3://guarded")
    finally:
        server.terminate()
        server.wait(timeout=30)
