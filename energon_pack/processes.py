"""Child processes that die with the run that started them, and output locks never left to orphans.

A run that writes an output folder (``pack-offline``, ``convert``) holds an exclusive ``flock`` and forks worker
processes. A forked child inherits the lock's file descriptor, and a child outlives a SIGKILLed parent: the
orphans would then hold the lock, and every later run would be refused, forever. So:

- every child forked while a lock is held closes its copy of the lock (:func:`lock`) and dies with its parent
  (:func:`die_with_parent`: Linux ``PR_SET_PDEATHSIG``, which fires when the *forking thread* ends, so a child
  forked from another thread watches its parent instead); :func:`process_pool` workers die with it anyway;
- :func:`process_pool` ends its workers (never waits for them) when its block raises;
- :func:`sigterm_exits` turns the default SIGTERM into ``SystemExit(143)``, so the ``finally`` blocks run (staging
  removed, lock released, workers ended) instead of the process vanishing;
- a lock whose recorded holder is gone, held only by processes of the holder's own command line (its orphaned
  workers, e.g. of an older version), is taken over: they are killed, with one :class:`StaleLockWarning`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import multiprocessing
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

__all__ = [
    "StaleLockWarning",
    "die_with_parent",
    "holder_note",
    "lock",
    "process_pool",
    "sigterm_exits",
    "unlock",
]

_PR_SET_PDEATHSIG = 1
#: seconds the orphans of a killed run, or a failed pool's workers, are given to end after SIGKILL / SIGTERM
END_WAIT_S = 5.0
_WATCH_S = 0.2  # how often a child forked from a non-main thread checks that its parent lives

_HELD: set[int] = set()  # lock fds this process holds: closed in every child forked meanwhile
_FORK: dict[str, Any] = {"pid": 0, "main": True}  # who forked (set just before each fork, read in the child)
_BOUND = False  # this process already dies with its parent
_DEFER: dict[str, Any] = {"on": False}  # SIGTERM while a pool forks: its SystemExit waits for the fork's end


class StaleLockWarning(RuntimeWarning):
    """A killed run's lock was taken over (its orphaned workers still held it)."""


def _libc_prctl() -> Callable[..., int] | None:
    try:  # the running program's symbols, libc's among them (find_library would run ldconfig)
        return getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    except (OSError, TypeError):
        return None


_PRCTL = _libc_prctl()  # resolved once, in the parent: a forked child only calls it


def _before_fork() -> None:
    _FORK["pid"], _FORK["main"] = os.getpid(), threading.current_thread() is threading.main_thread()


def _after_fork_child() -> None:
    """In every forked child: the default SIGTERM back; while a lock is held, the lock's copy closed and the child
    bound to its parent."""
    global _BOUND
    _BOUND = False
    if isinstance(signal.getsignal(signal.SIGTERM), _ExitOnSigterm):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _HELD:
        return
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()
    die_with_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)


def die_with_parent() -> None:
    """Bind this (forked) process to its parent: killed when the parent dies, SIGKILL included; exits at once if
    the parent is already gone. Call it first in a worker's initializer; idempotent."""
    global _BOUND
    if _BOUND:
        return
    _BOUND = True
    parent = _FORK["pid"] if _FORK["pid"] and _FORK["pid"] != os.getpid() else os.getppid()
    if _PRCTL is not None and _FORK["main"]:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:  # PDEATHSIG would fire when the forking thread ends, not the parent: watch the parent instead
        threading.Thread(target=_watch, args=(parent,), daemon=True, name="energon-pack-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(1)


# ----------------------------------------------------------------------------- worker pools
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class KeptProcesses(type(multiprocessing.get_context(START_METHOD))):  # type: ignore[misc]
    """The pool's start method (fork: no re-import of the user's ``__main__``), keeping the processes it starts:
    they can be ended, and a dead worker's exit status names the death."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[Any] = []

    def Process(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the context API's name
        proc = super().Process(*args, **kwargs)
        self.processes.append(proc)
        return proc


class _Pool(ProcessPoolExecutor):
    """Its ``submit`` (which forks the workers) defers SIGTERM's SystemExit to its own end: raised inside an
    at-fork callback (``logging``'s, ours), Python would swallow it."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        _DEFER["on"] = True
        try:
            return super().submit(*args, **kwargs)
        finally:
            _DEFER["on"] = False
            if _DEFER.pop("signum", None) is not None:
                raise SystemExit(128 + signal.SIGTERM)


def _init_worker(initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    die_with_parent()
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def process_pool(
    workers: int,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
    context: KeptProcesses | None = None,
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``workers`` processes that die with this one. The block's normal end waits for
    the submitted tasks; an exception (SIGTERM's SystemExit, Ctrl-C, a failed task) cancels the pending tasks and
    ends the workers (SIGTERM, then SIGKILL after :data:`END_WAIT_S`) instead of waiting for them."""
    ctx = KeptProcesses() if context is None else context
    pool = _Pool(workers, mp_context=ctx, initializer=_init_worker, initargs=(initializer, initargs))
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        end_processes(ctx.processes)
        raise
    pool.shutdown(wait=True)


def end_processes(processes: list[Any]) -> None:
    """SIGTERM each live process, SIGKILL those still alive after :data:`END_WAIT_S`; each joined."""
    for proc in processes:
        with contextlib.suppress(Exception):
            if proc.is_alive():
                proc.terminate()
    deadline = time.monotonic() + END_WAIT_S
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)


# ----------------------------------------------------------------------------- SIGTERM
#: seconds SIGTERM leaves for ``finally`` blocks before the process exits regardless (a SystemExit raised inside a
#: finaliser or another library's callback is swallowed by Python)
TERM_GRACE_S = 15.0


class _ExitOnSigterm:
    """SIGTERM's handler: SystemExit(143) for the cleanup, and an exit regardless after :data:`TERM_GRACE_S` (or at
    a second SIGTERM); the workers, bound to this process, die with it."""

    def __init__(self) -> None:
        self.hit = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.hit:
            os._exit(128 + signum)
        self.hit = True
        timer = threading.Timer(TERM_GRACE_S, os._exit, (128 + signum,))
        timer.daemon = True
        timer.start()
        if _DEFER["on"]:  # forking: raised when the fork is over (_Pool.submit)
            _DEFER["signum"] = signum
            return
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While the block runs (in the main thread, where SIGTERM still has its default action), SIGTERM raises
    ``SystemExit(143)``, so ``finally`` blocks clean up; a handler the program installed is left alone."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _ExitOnSigterm())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ----------------------------------------------------------------------------- locks
_NOTE = re.compile(r"pid=(\d+) cmdline=([0-9a-f]+)")


def _cmdline_hash(pid: int | str) -> str | None:
    try:
        return hashlib.sha1(Path(f"/proc/{pid}/cmdline").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def holder_note() -> str:
    """``pid=N cmdline=HASH`` of this process: what a lock's record says, so a later run can tell whether the
    holder is gone and which processes were its workers (forked children share its command line)."""
    return f"pid={os.getpid()} cmdline={_cmdline_hash('self') or '0'}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped) holds no file
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _holders(target: os.stat_result) -> list[int]:
    """Other live processes with a file descriptor open on ``target`` (from ``/proc/*/fd``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                if _alive(int(entry.name)):
                    found.append(int(entry.name))
                break
    return found


def _take_over(fd: int, record: Path) -> bool:
    """Take the busy lock on ``fd`` if the holder ``record`` names is gone and only its orphaned workers (processes of
    its command line) still hold it: they are killed. False (nothing done) otherwise."""
    try:
        match = _NOTE.search(record.read_text(errors="replace"))
    except OSError:
        return False
    if match is None or _alive(int(match.group(1))):
        return False
    pid, cmdline = int(match.group(1)), match.group(2)
    orphans = _holders(os.fstat(fd))
    if not orphans or any(_cmdline_hash(p) != cmdline for p in orphans):
        return False
    for p in orphans:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + END_WAIT_S
    while any(_alive(p) for p in orphans) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    warnings.warn(
        f"took over the lock of {record.parent}: the run that held it (pid {pid}) is gone and its orphaned "
        f"worker(s) {', '.join(map(str, orphans))} still held it; they were killed",
        StaleLockWarning,
        stacklevel=3,
    )
    return True


def lock(fd: int, record: Path) -> bool:
    """Take an exclusive ``flock`` on ``fd`` (non-blocking): True when held. A busy lock is taken over when the
    holder ``record`` names (its :func:`holder_note`) is gone and only its orphans hold it. While held, every forked
    child closes its copy of ``fd`` and dies with its parent; :func:`unlock` releases it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not _take_over(fd, record):
            return False
    _HELD.add(fd)
    return True


def unlock(fd: int) -> None:
    """Close ``fd`` (releasing its lock)."""
    _HELD.discard(fd)
    os.close(fd)
