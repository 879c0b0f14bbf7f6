"""Small savable wrappers around our packing layer that make finite streams, skips and resume safe.

``build_batch`` stacks them as ``SourceEnd -> packing layer (carry or rounds) -> PackStream``:

- :class:`SourceEnd` (below the packer) remembers, in the checkpoint, that this pass over a
  finite source has ended (also for a worker that finished its whole share). Energon's sample loader resets itself to "start a new epoch" the
  moment its last sample is read, so a state saved while the packer is still flushing its last
  packs would otherwise restore into a fresh epoch: the remaining packs, then every sample again.
- :class:`PackStream` (above the packer) refuses a restore whose packing configuration differs
  (a fingerprint in the state), restores from a private deep copy of the state (the caller's
  object is never mutated), and holds the newest pack back by one so every pack carries the
  worker's stats as of the *next* pack: the last pack of a finite stream carries the final
  counts, so no skip that happened after it goes unreported. A held pack is checkpointed as its
  restore key and rebuilt with ``restore_sample`` on resume.
"""

from __future__ import annotations

import copy
import re
import logging
import warnings
from typing import Any, Callable, Dict, Iterator, Optional

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.wrappers.base import BaseWrapperDataset, get_sample_restore_key

from energon_pack.errors import AllSkippedError, ConfigError, all_skipped_fix, skip_counts_text  # noqa: F401 (AllSkippedError: re-exported)

log = logging.getLogger("energon_pack")

#: Default of ``PackingConfig.skip_guard``: a worker that has skipped this many samples (and at
#: least 10 buffers' worth) without emitting a single pack raises :class:`AllSkippedError`.
SKIP_GUARD_MIN = 1000


class ResumeConfigError(ConfigError):
    """ConfigError for a restore whose packing configuration differs from the checkpoint's.

    Also constructible from one message: PyTorch re-raises a worker's exception as
    ``type(exc)(formatted_message)``, so the main process still gets this ``ConfigError``.
    """

    def __init__(self, knob: str, problem: Optional[str] = None, fix: Optional[str] = None) -> None:
        if problem is None:
            ValueError.__init__(self, knob)
            found = re.search(r"ResumeConfigError: (\w+): ", knob)
            self.knob = found.group(1) if found else "packing"
        else:
            super().__init__(knob, problem, fix)


def skip_guard_limit(configured: Optional[int], buffer_size: int) -> int:
    return configured if configured is not None else max(SKIP_GUARD_MIN, 10 * buffer_size)


def all_skipped_message(stats, worker: str, *, finished: bool) -> str:
    where = "its whole share of the finite stream" if finished else f"the first {stats.skipped} samples it read"
    fix = all_skipped_fix(
        stats.skips,
        too_long="seq_length (the pack width) may be too small for these samples, or set overlength='truncate' (text)",
        mismatch="the records may not match the encoder: check the field names (prompt/completion, "
                 "conversations/messages) and that this is the right task encoder for the dataset")
    return f"{worker} skipped {where} and emitted 0 packs; skips by reason: {skip_counts_text(stats.skips)}. Likely fix: {fix}."


def worker_name(worker_config) -> str:
    wid = worker_config.rank_worker_id() if worker_config.num_workers else 0
    return f"rank {worker_config.rank} worker {wid}"


class SkipRateMonitor:
    """Logs one warning per worker when at least ``rate`` of ``window`` consecutive source samples
    were skipped (``PackingConfig.skip_warn_rate`` / ``skip_warn_window``): reasons with counts
    and one example per reason. Reads the packing layer's ``stats`` (so packer skips such as
    ``oversize`` count too); examples come from the pre-encode skip markers it sees."""

    def __init__(self, layer: Any, *, rate: float, window: int, worker_config) -> None:
        self.layer, self.rate, self.window, self.worker_config = layer, rate, window, worker_config
        self.warned = False
        self._seen = 0
        self._start = (0, 0)  # (samples seen, skips counted) when the current window began
        self._examples: Dict[str, str] = {}

    def after(self, sample: Any) -> None:
        if self.warned:
            return
        reason = getattr(sample, "reason", None)
        if isinstance(reason, str) and reason not in self._examples:
            self._examples[reason] = f"{getattr(sample, '__key__', '?')}: {getattr(sample, 'detail', '')}"[:300]
        self._seen += 1
        seen0, skipped0 = self._start
        if self._seen - seen0 < self.window:
            return
        stats = self.layer.stats
        skipped = stats.skipped - skipped0
        n = self._seen - seen0
        self._start = (self._seen, stats.skipped)
        if skipped >= self.rate * n:
            self.warned = True
            message = skip_rate_message(stats, worker_name(self.worker_config), skipped, n, self.rate, self._examples)
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def skip_rate_message(stats, worker: str, skipped: int, n: int, rate: float, examples: Dict[str, str]) -> str:
    reasons = ", ".join(f"{r}: {c}" for r, c in sorted(stats.skips.items(), key=lambda kv: -kv[1]))
    shown = "; ".join(f"{r}: {examples.get(r, 'no example (counted by the packer)')}"
                      for r, _ in sorted(stats.skips.items(), key=lambda kv: -kv[1]))
    return (f"{worker}: {skipped} of the last {n} samples were skipped ({skipped / n:.0%}, at or above "
            f"skip_warn_rate {rate:.0%}); skips by reason so far: {reasons}; one example per reason: {shown}. "
            "Check the field names, seq_length and that this task encoder fits the data "
            "(logged once per worker; PackingConfig.skip_warn_rate=None turns this off)")


class SourceEnd(BaseWrapperDataset):
    """Pass-through that records in its state that the source has ended for this pass.

    ``_done`` stays set after the pass (a worker that finished its share checkpoints "done",
    not "fresh"). The next ``iter`` starts a new pass, unless the state was just restored: then
    the pass it belongs to is already read and the source yields nothing (the packing layer
    above only drains what it still holds). ``on_sample`` (set by the packing layer) is called
    after every source sample.
    """

    _savable_fields = ("_done",)

    def __init__(self, dataset: SavableDataset, *, worker_config) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.on_sample: Optional[Callable[[], None]] = None
        self.monitor: Optional[SkipRateMonitor] = None  # set by PackStream
        self._restored = False
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._done = False

    def restore_state(self, state) -> None:
        super().restore_state(state)
        self._restored = True

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self) -> Iterator[Any]:
        restored, self._restored = self._restored, False
        if self._done:
            if restored:
                return
            self._done = False
        for sample in self.dataset:
            yield sample
            if self.on_sample is not None:
                self.on_sample()
            if self.monitor is not None:
                self.monitor.after(sample)
        self._done = True

    def config(self) -> Dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"SourceEnd(dataset={self.dataset})"


class PackStream(BaseWrapperDataset):
    """Stats on every pack (one pack of latency), config fingerprint, copy-on-restore.

    The wrapped packing layer exposes ``stats`` (:class:`PackingStats`) and ``emitted`` (packs
    yielded so far by this worker).
    """

    _savable_fields = ("_held_key", "_fingerprint")

    def __init__(self, dataset: SavableDataset, *, fingerprint: Dict[str, Any], worker_config,
                 skip_warning: Optional[tuple] = None) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.fingerprint = dict(fingerprint)
        source = getattr(dataset, "dataset", None)
        if skip_warning is not None and skip_warning[0] is not None and isinstance(source, SourceEnd):
            source.monitor = SkipRateMonitor(dataset, rate=skip_warning[0], window=skip_warning[1],
                                             worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._held_key = None
        self._fingerprint = dict(self.fingerprint)

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    # ------------------------------------------------------------------ restore
    def restore_state(self, state) -> None:
        if state is not None:
            check_fingerprint(state.get("_fingerprint"), self.fingerprint)
            state = copy.deepcopy(state)  # restoring must never mutate the caller's checkpoint
        super().restore_state(state)
        self._fingerprint = dict(self.fingerprint)

    # ------------------------------------------------------------------ streaming
    def __iter__(self) -> Iterator[Any]:
        hold = self.dataset.can_restore_sample()
        held = None
        if self._held_key is not None:
            held = self.dataset.restore_sample(self._held_key)
        for packed in self.dataset:
            if not hold:
                yield self._with_stats(packed)
                continue
            previous, held = held, packed
            self._held_key = get_sample_restore_key(packed)
            if previous is not None:
                yield self._with_stats(previous)
        if held is not None:
            self._held_key = None
            yield self._with_stats(held)
        self._end_of_stream()

    def _with_stats(self, packed: Any) -> Any:
        if hasattr(packed, "packing_stats"):
            packed.packing_stats = {**_identity(self.worker_config), **self.dataset.stats.state_dict()}
        return packed

    def _end_of_stream(self) -> None:
        stats = self.dataset.stats
        name = worker_name(self.worker_config)
        if self.dataset.emitted == 0 and stats.skipped:
            message = all_skipped_message(stats, name, finished=True)
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:
            log.info("%s: end of stream: %s", name, stats.summary())

    def config(self) -> Dict[str, Any]:
        return {"type": type(self).__qualname__, "fingerprint": self.fingerprint, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"PackStream(dataset={self.dataset})"


def _identity(worker_config) -> dict:
    return {"rank": worker_config.rank, "worker": worker_config.rank_worker_id() if worker_config.num_workers else 0}


def check_fingerprint(saved: Optional[Dict[str, Any]], current: Dict[str, Any]) -> None:
    """Raise ConfigError naming the first knob whose value differs between checkpoint and now."""
    if saved is None:
        return  # a checkpoint from before fingerprints were stored: nothing to compare
    for knob in sorted(set(saved) | set(current)):
        old, new = saved.get(knob), current.get(knob)
        if _plain(old) != _plain(new):
            raise ResumeConfigError(
                knob,
                f"the checkpoint was saved with {knob}={old!r}, this loader has {knob}={new!r}; "
                "exact resume needs the same packing configuration",
                f"restore with {knob}={old!r} (or start the packing stream fresh without restoring its state)",
            )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
