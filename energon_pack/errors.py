"""Typed outcomes for bad input.

A sample that cannot be used raises :class:`SampleSkipped` with a short machine-readable
``reason`` (e.g. ``"corrupt_image"``); the loader layer counts it per reason and keeps going,
so nothing is dropped silently. Configuration mistakes raise :class:`ConfigError` (a
``ValueError``) naming the knob and the fix. A loader whose every sample is skipped raises
:class:`AllSkippedError` (reasons, counts, the likely fix) instead of yielding nothing.
"""

from __future__ import annotations

from collections.abc import Mapping


def _rebuild_exception(cls: type, args: tuple, state: dict) -> BaseException:
    exc = cls.__new__(cls)
    BaseException.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


def _reduce_exception(self: BaseException):
    """Pickle an exception with its message and attributes, without calling ``__init__`` again
    (whose signature differs from ``args``): our errors cross process boundaries intact."""
    return _rebuild_exception, (type(self), self.args, self.__dict__)


class SampleSkipped(Exception):
    """A sample that must be skipped, with a reason code and a human detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    __reduce__ = _reduce_exception


class ConfigError(ValueError):
    """An invalid configuration: the message names the knob and how to fix it."""

    def __init__(self, knob: str, problem: str, fix: str) -> None:
        super().__init__(f"{knob}: {problem}. Fix: {fix}")
        self.knob = knob
        self.problem = problem
        self.fix = fix

    __reduce__ = _reduce_exception


class AllSkippedError(RuntimeError):
    """Every sample read was skipped, so nothing can be emitted (Energon workers, GPT-SFT sampler)."""


#: skip reasons that mean "the records do not match the encoder / format"
MISMATCH_REASONS = ("missing_field", "invalid_json", "no_assistant_turn", "empty_completion", "invalid_record")


def skip_counts_text(skips: Mapping[str, int]) -> str:
    """``"reason: n, ..."``, most frequent first (``"none"`` when empty)."""
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(skips.items(), key=lambda kv: -kv[1])) or "none"


#: skip reasons whose fix does not depend on the encoder
REASON_FIXES = {"tool_calls_unsupported": "the Qwen2-VL / Qwen2.5-VL templates have no tool handling: use the "
                                          "qwen3-vl preset (--preset qwen3-vl; preset=\"qwen3-vl\") for tool-call data"}


def all_skipped_fix(skips: Mapping[str, int], *, too_long: str, mismatch: str) -> str:
    """The likely fix for a run that skipped everything: ``too_long`` when samples did not fit,
    ``mismatch`` when the records do not match (or nothing else explains it)."""
    top = max(skips, key=skips.get) if skips else ""
    if top in REASON_FIXES:
        return REASON_FIXES[top]
    hint = [too_long] if top in ("oversize", "too_long") or "oversize" in skips else []
    if top in MISMATCH_REASONS or not hint:
        hint.append(mismatch)
    return "; or ".join(hint)
