"""Typed outcomes for bad input.

A sample that cannot be used raises :class:`SampleSkipped` with a short machine-readable
``reason`` (e.g. ``"corrupt_image"``); the loader layer counts it per reason and keeps going,
so nothing is dropped silently. Configuration mistakes raise :class:`ConfigError` (a
``ValueError``) naming the knob and the fix. A loader whose every sample is skipped raises
:class:`AllSkippedError` (reasons, counts, the likely fix) instead of yielding nothing; a worker
that skips most of what it reads warns with :class:`SkipRateWarning`.

Both carry their data (who, skip counts, fixes as :class:`Hint` objects naming their knobs), so a
tool can word them for its users: ``str()`` names the Python knobs, ``render(names)`` the names
a tool gives them (a hint whose knob it cannot set is left out).
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


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


def raise_config_errors(errors: Sequence[ConfigError]) -> None:
    """Raise every wrong knob of one check at once: the single error itself, or one ConfigError naming them all
    (its ``.errors`` lists them) so that a user fixes a config in one round; nothing when ``errors`` is empty."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        err = ConfigError(
            ", ".join(e.knob for e in errors),
            f"{len(errors)} settings are wrong:\n  " + "\n  ".join(str(e) for e in errors),
            "change each setting as listed",
        )
        err.errors = list(errors)
        raise err


@dataclass(frozen=True)
class Hint:
    """One suggested fix, worded over the knobs it names: ``text`` has a ``{knob}`` placeholder for
    each knob in ``knobs``. ``python`` says how a knob reads for Python callers where that is not its
    bare name (``(("seq_length", "seq_length (the pack width)"),)``); ``sep`` joins this hint to the one
    before it in a list of alternatives.

    Args:
        text: the fix, with ``{knob}`` placeholders (literal braces doubled, as in ``str.format``).
        knobs: the knobs the text names, in any order.
        python: (knob, wording) pairs for Python callers; other knobs read as their own name.
        sep: the text between the previous hint and this one.
    """

    text: str
    knobs: tuple[str, ...] = ()
    python: tuple[tuple[str, str], ...] = ()
    sep: str = "; or "

    def __post_init__(self) -> None:
        named = {field for _, field, _, _ in string.Formatter().parse(self.text) if field}
        if named != set(self.knobs):
            raise ValueError(f"Hint {self.text!r}: placeholders {sorted(named)} differ from knobs {sorted(self.knobs)}")

    @classmethod
    def plain(cls, text: str) -> Hint:
        """A hint that names no knob, ``text`` taken literally (braces and all)."""
        return cls(text.replace("{", "{{").replace("}", "}}"))

    def render(self, names: Mapping[str, str] | None = None) -> str | None:
        """The text with Python names (``names`` None) or with ``names`` (None when one knob has none)."""
        if names is None:
            names = {**{k: k for k in self.knobs}, **dict(self.python)}
        elif any(k not in names for k in self.knobs):
            return None
        return self.text.format_map({k: names[k] for k in self.knobs})


def render_hints(hints: Sequence[Hint], names: Mapping[str, str] | None = None) -> str:
    """The alternatives of ``hints`` as one text, each joined by its ``sep`` (dropped ones left out)."""
    out = ""
    for hint in hints:
        text = hint.render(names)
        if text is not None:
            out += (hint.sep if out else "") + text
    return out


#: how messages in this process (and the loader workers it forks) name knobs; None: Python names
_NAMES: list[Mapping[str, str] | None] = [None]


@contextlib.contextmanager
def knob_names(names: Mapping[str, str] | None) -> Iterator[None]:
    """Within the block, ``str()`` of :class:`AllSkippedError` / :class:`SkipRateWarning` renders
    with ``names`` (a tool's own, e.g. CLI flags) instead of the Python knobs. A message built in a
    forked DataLoader worker crosses to the main process as text only, so a tool that words these
    messages sets this before its loaders start."""
    _NAMES.append(names)
    try:
        yield
    finally:
        _NAMES.pop()


class _SkipReport:
    """What :class:`AllSkippedError` and :class:`SkipRateWarning` share: who skipped, the counts and
    the hints; ``render(names)`` words them for a tool, ``str()`` for Python (or :func:`knob_names`)."""

    who: str
    skips: dict[str, int] | None
    hints: tuple[Hint, ...]

    def render(self, names: Mapping[str, str] | None = None) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render(_NAMES[-1])


class AllSkippedError(_SkipReport, RuntimeError):
    """Every sample read was skipped, so nothing can be emitted (Energon workers, GPT-SFT sampler).

    The message is ``"{summary}; skips by reason: {counts}.[ Example ({reason}): {example}.] Likely
    fix: {hints}."``. Built from one message (``AllSkippedError(text)``, as PyTorch re-raises a
    worker's error), it is that text, with no counts or hints.

    Args:
        summary: who skipped what, as a clause (``"rank 0 worker 0 skipped ... and emitted 0 packs"``).
        who: the reader that skipped (a worker, a sampler over a file); default: ``summary``.
        skips: skip counts per reason; None for a plain message.
        hints: the likely fixes, alternatives of each other.
        example: one skipped sample, for the most frequent reason.
    """

    def __init__(
        self,
        summary: str,
        *,
        who: str | None = None,
        skips: Mapping[str, int] | None = None,
        hints: Sequence[Hint] = (),
        example: str | None = None,
    ) -> None:
        self.summary, self.who = summary, summary if who is None else who
        self.skips = None if skips is None else dict(skips)
        self.hints, self.example = tuple(hints), example
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """The message with the knobs named by ``names`` (Python names when None)."""
        if self.skips is None:
            return self.summary
        top = max(self.skips, key=self.skips.get) if self.skips else ""
        fix = render_hints(self.hints, names)
        return (
            f"{self.summary}; skips by reason: {skip_counts_text(self.skips)}."
            + (f" Example ({top}): {self.example}." if self.example else "")
            + (f" Likely fix: {fix}." if fix else "")
        )

    __reduce__ = _reduce_exception


class SkipRateWarning(_SkipReport, RuntimeWarning):
    """At least ``rate`` of the last ``window`` samples a worker read were skipped (once per worker).

    Args:
        who: the worker (``"rank 0 worker 1"``).
        skipped: samples skipped in the window.
        window: samples read in the window.
        rate: the threshold (``PackingConfig.skip_warn_rate``).
        skips: skip counts per reason so far.
        examples: one example per reason (``"key: detail"``).
        hints: what to check.
    """

    def __init__(
        self,
        who: str,
        *,
        skipped: int,
        window: int,
        rate: float,
        skips: Mapping[str, int],
        examples: Mapping[str, str],
        hints: Sequence[Hint] = (),
    ) -> None:
        self.who, self.skipped, self.window, self.rate = who, skipped, window, rate
        self.skips, self.examples, self.hints = dict(skips), dict(examples), tuple(hints)
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """The message with the knobs named by ``names`` (Python names when None); the threshold's
        knob and how to turn the warning off are named only where ``names`` has ``skip_warn_rate``."""
        off = "PackingConfig.skip_warn_rate" if names is None else names.get("skip_warn_rate")
        ordered = sorted(self.skips.items(), key=lambda kv: -kv[1])
        reasons = ", ".join(f"{r}: {c}" for r, c in ordered)
        shown = "; ".join(f"{r}: {self.examples.get(r, 'no example (counted by the packer)')}" for r, _ in ordered)
        threshold = (f"{off.rsplit('.', 1)[-1]} " if off else "") + f"{self.rate:.0%}"
        check = render_hints(self.hints, names)
        return (
            f"{self.who}: {self.skipped} of the last {self.window} samples were skipped "
            f"({self.skipped / self.window:.0%}, at or above {threshold}); skips by reason so far: {reasons}; "
            f"one example per reason: {shown}."
            + (f" {check}" if check else "")
            + (f" (logged once per worker; {off}=None turns this off)" if off else " (once per worker)")
        )


#: skip reasons that mean "the records do not match the encoder / format"
MISMATCH_REASONS = ("missing_field", "invalid_json", "no_assistant_turn", "empty_completion", "invalid_record")


def skip_counts_text(skips: Mapping[str, int]) -> str:
    """``"reason: n, ..."``, most frequent first (``"none"`` when empty)."""
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(skips.items(), key=lambda kv: -kv[1])) or "none"


#: skip reasons whose fix does not depend on the encoder
REASON_FIXES = {
    "tool_calls_unsupported": "the Qwen2-VL / Qwen2.5-VL templates have no tool handling: use the "
    'qwen3-vl preset (--preset qwen3-vl; preset="qwen3-vl") for tool-call data',
    "unsupported_audio": "audio is not trained here (images, videos and text are): drop the audio records, or "
    "train them with an audio-capable pipeline",
    "preference_data": "chosen/rejected records are DPO/ORPO/reward-model pairs, not SFT: train them with a "
    'DPO/ORPO/reward trainer, or train their chosen answers as SFT with preference="chosen" (--preference chosen)',
    "kto_undesirable": "KTO examples labelled false are undesirable answers, never SFT: keep the true ones, or train "
    "with a KTO trainer",
    "kto_label_unreadable": "a KTO label (kto_tag / label) that is not true/false, 1/0 or 'true'/'false': fix the "
    "values, or rename the field if it is not a KTO label",
    "needs_chat_format": 'alpaca records with a system prompt or history need the chat format: format="chat" '
    "(--format chat)",
    "prompt_field_mismatch": "the prompt field is empty where another prompt field holds text: name the prompt field "
    "(prompt_field=, --prompt-field)",
    "video_too_large": "the videos' frames exceed the pixel caps: raise energon_pack.video.probe.MAX_FRAME_PIXELS / "
    "MAX_SAMPLE_PIXELS before the loader starts, or downscale the videos",
}


def all_skipped_hints(skips: Mapping[str, int], *, too_long: Sequence[Hint], mismatch: Hint) -> tuple[Hint, ...]:
    """The likely fixes for a run that skipped everything: ``too_long`` when samples did not fit,
    ``mismatch`` when the records do not match (or nothing else explains it)."""
    top = max(skips, key=skips.get) if skips else ""
    if top in REASON_FIXES:
        return (Hint.plain(REASON_FIXES[top]),)
    hints = list(too_long) if top in ("oversize", "too_long") or "oversize" in skips else []
    if top in MISMATCH_REASONS or not hints:
        hints.append(mismatch)
    return tuple(hints)


def all_skipped_fix(skips: Mapping[str, int], *, too_long: str, mismatch: str) -> str:
    """:func:`all_skipped_hints` for fixes given as plain text (no knobs to rename)."""
    return render_hints(all_skipped_hints(skips, too_long=[Hint.plain(too_long)], mismatch=Hint.plain(mismatch)))
