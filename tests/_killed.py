"""Helpers for tests that kill a command run in a subprocess: its forked workers found, and waited for."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
#: the environment of a subprocess that imports the tests' helpers (``_bridge_light``)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: list[int], within: float = 5.0) -> list[int]:
    """The processes of ``pids`` still alive after ``within`` seconds (at once when all are gone)."""
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def started_workers(proc: subprocess.Popen, count: int, within: float = 120.0) -> list[int]:
    """The pids of ``proc``'s children once it has ``count`` of them (it failing or timing out fails the test)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        main = psutil.Process(proc.pid)
        children = [c.pid for c in main.children(recursive=True) if _cmdline(c) == _cmdline(main)]  # forked
        if len(children) >= count:
            return children
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {count} workers within {within} s: {proc.communicate()}")


def _cmdline(proc: psutil.Process) -> list[str] | None:
    try:
        return proc.cmdline()
    except psutil.Error:
        return None
