"""A SIGALRM watchdog: a call that blocks past its budget raises :class:`Hang`, which the sweeps count."""

from __future__ import annotations

import contextlib
import signal

HANG_SECONDS = 120


class Hang(Exception):
    """Raised inside a :func:`hang_alarm` block when its time is up."""


def _alarm(_signum, _frame):
    raise Hang()


@contextlib.contextmanager
def hang_alarm(seconds: int):
    """Raise :class:`Hang` in the block after ``seconds`` (SIGALRM); the previous handler is
    restored and the alarm cleared on the way out."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
