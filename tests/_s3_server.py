"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, and the MSC config
that points Energon's ``msc://`` paths at it.

The server runs in a process of its own (its own GIL: loader workers and the server do not share
one), not a child of the test process (benchmarks wait for and measure their children), on a free
port; it is stopped when the ``with`` block ends, however it ends, and ends itself within a second
when the test process is gone (killed). The MSC config names only the endpoint; the credentials
come from the environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILE = "energon-s3"
PROFILE_DOWN = "energon-s3-down"
#: the same bucket behind a front that accepts a whole-object GET of a shard under :data:`STALL_PREFIX`
#: and never answers it (ranged reads, HEADs and listings pass): a store that hangs mid-run
PROFILE_STALL = "energon-s3-stall"
STALL_PREFIX = "stall/"
#: behind the same front, a GET of a shard or its index (``.tar``, ``.tar.idx``) under :data:`DRIP_PREFIX` is answered
#: (status, headers, the whole Content-Length) but its body comes :data:`DRIP_BYTES` bytes every
#: :data:`DRIP_INTERVAL` seconds: each read gets a byte well within any read timeout, so only a wall-clock bound ends
#: it (a ranged GET of at most 64 bytes, the shard check's index tail, is answered at once)
DRIP_PREFIX = "drip/"
#: the same front, with MSC's multipart threshold at 1 KiB: objects are downloaded by s3transfer's threads (as MSC does
#: above 64 MiB), not in the calling thread
PROFILE_MULTIPART = "energon-s3-multipart"
DRIP_BYTES, DRIP_INTERVAL = 1, 0.5
BUCKET = "energon-pack-test"
#: what the tests set in the environment while the server runs (moto accepts any key)
ENV = {
    "AWS_ACCESS_KEY_ID": "energon-pack-test",
    "AWS_SECRET_ACCESS_KEY": "energon-pack-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Store:
    """The running server: ``url(key)`` is the ``msc://`` path of an object or prefix in the bucket."""

    endpoint: str
    config_path: Path
    client: Any  # a boto3 S3 client

    def url(self, key: str = "", profile: str = PROFILE) -> str:
        return f"msc://{profile}/{BUCKET}/{key}".rstrip("/")

    def upload(self, folder: str | Path, prefix: str) -> str:
        """Every file under ``folder`` (hidden ones included) to ``prefix``, with boto3 directly (not through the
        code under test); returns ``url(prefix)``."""
        folder = Path(folder)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return self.url(prefix)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the head of every server script: a thread that ends the process when the test process (argv[1]) is gone
_WATCH = """
import os, sys, threading, time
test_pid = int(sys.argv[1])
def watch():
    while True:
        time.sleep(0.5)
        try:
            os.kill(test_pid, 0)
        except OSError:
            os._exit(0)
threading.Thread(target=watch, daemon=True).start()
"""
#: the server process: moto's server
_SERVER = (
    _WATCH
    + """
from moto.server import main
main(["-H", "127.0.0.1", "-p", sys.argv[2]])
"""
)
#: the stalling front: forwards GET and HEAD to moto, except a GET without a Range header of a ``.tar``
#: object under the stall prefix, which it reads and never answers (the connection stays open), and a GET of a
#: ``.tar`` / ``.tar.idx`` object under the drip prefix, whose body it sends a few bytes at a time
_FRONT = (
    _WATCH
    + """
import http.client, re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, upstream, prefix = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
drip_prefix, drip_bytes, drip_interval = sys.argv[5], int(sys.argv[6]), float(sys.argv[7])
def drips(command, path, headers):
    key = path.split("/", 2)[-1]
    if command != "GET" or not key.startswith(drip_prefix) or not key.endswith((".tar", ".tar.idx")):
        return False
    ranged = re.fullmatch(r"bytes=(\\d+)-(\\d+)", headers.get("Range", ""))
    return ranged is None or int(ranged.group(2)) - int(ranged.group(1)) >= 64
class Front(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def forward(self):
        path = self.path.split("?")[0]
        if (self.command == "GET" and "Range" not in self.headers and path.endswith(".tar")
                and path.split("/", 2)[-1].startswith(prefix)):
            while True:
                time.sleep(3600)
        conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=60)
        conn.request(self.command, self.path, headers=dict(self.headers))
        reply = conn.getresponse()
        body = reply.read()
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)) if self.command == "GET" else
                         reply.getheader("Content-Length", "0"))
        self.end_headers()
        if self.command == "GET" and drips(self.command, path, self.headers):
            for i in range(0, len(body), drip_bytes):
                self.wfile.write(body[i : i + drip_bytes])
                self.wfile.flush()
                time.sleep(drip_interval)
        elif self.command == "GET":
            self.wfile.write(body)
    do_GET = do_HEAD = forward
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", port), Front).serve_forever()
"""
)
#: starts the server in its own session and prints its pid: the server is not a child of the test
#: process, whose benchmarks wait for and measure their own children (the loader workers)
_LAUNCH = """
import subprocess, sys
proc = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(proc.pid)
"""


def _launch(script: str, *args: str) -> int:
    """Run ``script`` in a session of its own (see :data:`_LAUNCH`); its pid."""
    launched = subprocess.run(
        [sys.executable, "-c", _LAUNCH, script, *args], capture_output=True, text=True, check=True
    )
    return int(launched.stdout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _stop(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid):
            return


def _wait_listening(port: int, pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise RuntimeError(f"the server (pid {pid}) exited before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the server not listening on 127.0.0.1:{port} after {timeout:.0f} s")


@contextlib.contextmanager
def s3_server(workdir: str | Path) -> Iterator[S3Store]:
    """Start moto's S3 server, create the bucket, write the MSC config into ``workdir`` and set
    ``MSC_CONFIG`` and the credentials in ``os.environ`` (subprocesses inherit them); everything is
    undone and the server stopped on exit."""
    import boto3

    port, front_port = _free_port(), _free_port()
    pid = _launch(_SERVER, str(os.getpid()), str(port))
    front_pid = _launch(
        _FRONT,
        str(os.getpid()),
        str(front_port),
        str(port),
        STALL_PREFIX,
        DRIP_PREFIX,
        str(DRIP_BYTES),
        str(DRIP_INTERVAL),
    )
    saved = {k: os.environ.get(k) for k in (*ENV, "MSC_CONFIG")}
    try:
        _wait_listening(port, pid)
        _wait_listening(front_port, front_pid)
        endpoint = f"http://127.0.0.1:{port}"
        config = Path(workdir) / "msc_config.json"

        def profile(url: str, **options: Any) -> dict:
            return {
                "storage_provider": {
                    "type": "s3",
                    "options": {
                        "base_path": "",
                        "endpoint_url": url,
                        "region_name": ENV["AWS_DEFAULT_REGION"],
                        **options,
                    },
                }
            }

        config.write_text(
            json.dumps(
                {
                    "profiles": {
                        PROFILE: profile(endpoint),
                        PROFILE_STALL: profile(f"http://127.0.0.1:{front_port}"),
                        PROFILE_MULTIPART: profile(f"http://127.0.0.1:{front_port}", multipart_threshold=1024),
                        # nothing listens there: a store that cannot be reached, tried once
                        PROFILE_DOWN: {
                            **profile(f"http://127.0.0.1:{_free_port()}", retries={"max_attempts": 1}),
                            "retry": {"attempts": 1},
                        },
                    }
                }
            )
        )
        os.environ.update(ENV, MSC_CONFIG=str(config))
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        yield S3Store(endpoint, config, client)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _stop(front_pid)
        _stop(pid)
