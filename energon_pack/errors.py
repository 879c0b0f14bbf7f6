"""Typed outcomes for bad input.

A sample that cannot be used raises :class:`SampleSkipped` with a short machine-readable
``reason`` (e.g. ``"corrupt_image"``); the loader layer counts it per reason and keeps going,
so nothing is dropped silently. Configuration mistakes raise :class:`ConfigError` (a
``ValueError``) naming the knob and the fix.
"""

from __future__ import annotations


class SampleSkipped(Exception):
    """A sample that must be skipped, with a reason code and a human detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ConfigError(ValueError):
    """An invalid configuration: the message names the knob and how to fix it."""

    def __init__(self, knob: str, problem: str, fix: str) -> None:
        super().__init__(f"{knob}: {problem}. Fix: {fix}")
        self.knob = knob
