"""Skip reporting of a packing stream, per worker: the skip guard and the skip-rate warning.

A packing layer (carry-over or rounds) receives a :class:`SkipWatch` and calls it after every source sample
with its own stats, so a worker that only skips raises :class:`AllSkippedError` naming the reasons (instead of
hanging), and one that mostly skips warns once (:class:`SkipRateMonitor`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from energon_pack.errors import (
    AllSkippedError,
    Hint,
    SkipRateWarning,  # noqa: F401 (re-exported)
    all_skipped_hints,
)

from .fingerprint import ResumeConfigError  # noqa: F401 (its old path: energon_pack.energon.stream)

log = logging.getLogger("energon_pack")

#: Default of ``PackingConfig.skip_guard``: a worker that has skipped this many samples (and at
#: least 10 buffers' worth) without emitting a single pack raises :class:`AllSkippedError`.
SKIP_GUARD_MIN = 1000


def skip_guard_limit(configured: int | None, buffer_size: int) -> int:
    return configured if configured is not None else max(SKIP_GUARD_MIN, 10 * buffer_size)


#: the fixes an Energon worker that skipped everything suggests (knobs named, see :class:`Hint`)
TOO_LONG_HINTS = (
    Hint(
        "{seq_length} may be too small for these samples",
        ("seq_length",),
        python=(("seq_length", "seq_length (the pack width)"),),
    ),
    Hint(
        "set {overlength}='truncate' (text), 'fit' or 'split' (Qwen-VL: lower the pixels, split turns)",
        ("overlength",),
        sep=", or ",
    ),
)
MISMATCH_HINT = Hint(
    "the records may not match the encoder: check the field names (prompt/completion, "
    "conversations/messages) and that this is the right task encoder for the dataset"
)


def all_skipped_error(stats, worker: str, *, finished: bool) -> AllSkippedError:
    """The error of a worker that skipped everything it read (``finished``: its whole finite share)."""
    where = "its whole share of the finite stream" if finished else f"the first {stats.skipped} samples it read"
    return AllSkippedError(
        f"{worker} skipped {where} and emitted 0 packs",
        who=worker,
        skips=stats.skips,
        hints=all_skipped_hints(stats.skips, too_long=TOO_LONG_HINTS, mismatch=MISMATCH_HINT),
    )


def all_skipped_message(stats, worker: str, *, finished: bool) -> str:
    """``str()`` of :func:`all_skipped_error` (with the active :func:`~energon_pack.errors.knob_names`)."""
    return str(all_skipped_error(stats, worker, finished=finished))


def worker_name(worker_config) -> str:
    wid = worker_config.rank_worker_id() if worker_config.num_workers else 0
    return f"rank {worker_config.rank} worker {wid}"


class SkipRateMonitor:
    """Logs one warning per worker when at least ``rate`` of ``window`` consecutive source samples
    were skipped (``PackingConfig.skip_warn_rate`` / ``skip_warn_window``): reasons with counts
    and one example per reason. Reads the packing layer's ``stats`` (so packer skips such as
    ``oversize`` count too); examples come from the pre-encode skip markers it sees."""

    def __init__(self, *, rate: float, window: int, worker_config) -> None:
        self.rate, self.window, self.worker_config = rate, window, worker_config
        self.warned = False
        self._seen = 0
        self._start = (0, 0)  # (samples seen, skips counted) when the current window began
        self._examples: dict[str, str] = {}

    def after(self, sample: Any, stats) -> None:
        """Count ``sample`` (just consumed); ``stats``: the packing layer's :class:`PackingStats`."""
        if self.warned:
            return
        reason = getattr(sample, "reason", None)
        if isinstance(reason, str) and reason not in self._examples:
            self._examples[reason] = f"{getattr(sample, '__key__', '?')}: {getattr(sample, 'detail', '')}"[:300]
        self._seen += 1
        seen0, skipped0 = self._start
        if self._seen - seen0 < self.window:
            return
        skipped = stats.skipped - skipped0
        n = self._seen - seen0
        self._start = (self._seen, stats.skipped)
        if skipped >= self.rate * n:
            self.warned = True
            warning = skip_rate_warning(stats, worker_name(self.worker_config), skipped, n, self.rate, self._examples)
            log.warning(str(warning))
            warnings.warn(warning, stacklevel=2)


#: what a worker that skips most of its samples suggests checking
SKIP_RATE_HINT = Hint("Check the field names, {seq_length} and that this task encoder fits the data", ("seq_length",))


def skip_rate_warning(
    stats, worker: str, skipped: int, n: int, rate: float, examples: dict[str, str]
) -> SkipRateWarning:
    """The warning of a worker that skipped ``skipped`` of the last ``n`` samples (at or above ``rate``)."""
    return SkipRateWarning(
        worker, skipped=skipped, window=n, rate=rate, skips=stats.skips, examples=examples, hints=(SKIP_RATE_HINT,)
    )


def skip_rate_message(stats, worker: str, skipped: int, n: int, rate: float, examples: dict[str, str]) -> str:
    """``str()`` of :func:`skip_rate_warning` (with the active :func:`~energon_pack.errors.knob_names`)."""
    return str(skip_rate_warning(stats, worker, skipped, n, rate, examples))


class SkipWatch:
    """A packing layer's watch over one worker's skips, called after every source sample it consumed.

    Raises :class:`AllSkippedError` (naming the reasons) once the worker has skipped ``guard`` samples
    without emitting a pack, and feeds the :class:`SkipRateMonitor` when ``rate`` is set.

    Args:
        guard: skips without a pack before raising (``skip_guard_limit``); None: never.
        rate: the skip rate that warns (``PackingConfig.skip_warn_rate``); None: no warning.
        window: consecutive samples the rate is measured over (``PackingConfig.skip_warn_window``).
        worker_config: Energon's worker configuration (names the worker).
    """

    def __init__(self, *, guard: int | None, rate: float | None = None, window: int = 200, worker_config) -> None:
        self.guard, self.worker_config = guard, worker_config
        self.monitor = None if rate is None else SkipRateMonitor(rate=rate, window=window, worker_config=worker_config)

    def after(self, sample: Any, stats, emitted: int) -> None:
        """``sample`` was consumed; ``stats`` and ``emitted`` (packs so far) are the packing layer's."""
        if self.guard is not None and emitted == 0 and stats.skipped >= self.guard:
            raise all_skipped_error(stats, worker_name(self.worker_config), finished=False)
        if self.monitor is not None:
            self.monitor.after(sample, stats)
