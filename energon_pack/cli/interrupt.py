"""Ctrl-C for every command: the first one stops it at once with exit status 130, keeping what was
already written, ending loader worker processes and printing one line."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

#: seconds a Ctrl-C leaves for ``finally`` blocks before the process exits regardless (a
#: KeyboardInterrupt raised inside a finaliser or a library's cleanup is swallowed by Python)
INTERRUPT_GRACE_S = 2.0


class Interrupt:
    """The CLI's SIGINT handler: the first Ctrl-C raises KeyboardInterrupt (or exits at once inside
    a ``__del__``, where Python would swallow it) and the process exits with 130 within
    :data:`INTERRUPT_GRACE_S` however it is handled (worker processes are ended; a swallowed
    KeyboardInterrupt prints no "Exception ignored" noise); a second Ctrl-C exits at once."""

    def __init__(self, prog: str) -> None:
        self.prog, self.hit, self.reported, self.pid = prog, False, False, os.getpid()

    def __call__(self, signum: int, frame: Any) -> None:
        import signal
        import threading

        if os.getpid() != self.pid:  # a forked worker inherited the handler: the plain KeyboardInterrupt
            signal.default_int_handler(signum, frame)
        if self.hit or _in_finaliser(frame):  # Python would swallow a KeyboardInterrupt raised in a __del__
            self.exit()
        self.hit = True
        hook = sys.unraisablehook
        sys.unraisablehook = lambda u: None if isinstance(u.exc_value, KeyboardInterrupt) else hook(u)
        timer = threading.Timer(INTERRUPT_GRACE_S, self.exit)
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    def report(self) -> None:
        """The one line an interrupted command prints, once (progress bars cleared first)."""
        if self.reported:
            return
        self.reported = True
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
        print(f"{self.prog}: interrupted", file=sys.stderr, flush=True)

    def exit(self) -> NoReturn:
        import psutil

        self.report()
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
        sys.stdout.flush()
        os._exit(130)


def _in_finaliser(frame: Any) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (e.g. a DataLoader joining its workers in a gc pass)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def interruptible(prog: str, run: Any) -> int:
    """``run()`` with :class:`Interrupt` as the SIGINT handler (in the main thread): 130 on Ctrl-C."""
    import signal
    import threading

    handler = Interrupt(prog)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, handler) if main_thread else None
    try:
        return run()
    except KeyboardInterrupt:
        if handler.hit:  # a real Ctrl-C: the finally blocks have run; loader workers are not waited for
            handler.exit()
        handler.report()
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
