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

    def url(self, key: str = "") -> str:
        return f"msc://{PROFILE}/{BUCKET}/{key}".rstrip("/")

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


#: the server process: moto's server, and a thread that ends it when the test process is gone
_SERVER = """
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
from moto.server import main
main(["-H", "127.0.0.1", "-p", sys.argv[2]])
"""
#: starts the server in its own session and prints its pid: the server is not a child of the test
#: process, whose benchmarks wait for and measure their own children (the loader workers)
_LAUNCH = """
import subprocess, sys
proc = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(proc.pid)
"""


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
            raise RuntimeError("moto server exited before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"moto server not listening on 127.0.0.1:{port} after {timeout:.0f} s")


@contextlib.contextmanager
def s3_server(workdir: str | Path) -> Iterator[S3Store]:
    """Start moto's S3 server, create the bucket, write the MSC config into ``workdir`` and set
    ``MSC_CONFIG`` and the credentials in ``os.environ`` (subprocesses inherit them); everything is
    undone and the server stopped on exit."""
    import boto3

    port = _free_port()
    launched = subprocess.run(
        [sys.executable, "-c", _LAUNCH, _SERVER, str(os.getpid()), str(port)],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(launched.stdout)
    saved = {k: os.environ.get(k) for k in (*ENV, "MSC_CONFIG")}
    try:
        _wait_listening(port, pid)
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
        _stop(pid)
