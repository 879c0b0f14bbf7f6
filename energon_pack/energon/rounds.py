"""Rounds mode: Energon's own ``PackingDataset`` (partition each buffer of K fresh samples), made resumable.

Three things upstream's wrapper does not do, added by this subclass without changing which
samples form a round or how a round is partitioned:

- its counters (packs, fill, skips by reason) live in the checkpointed state, so
  ``packing_stats`` survive save/restore exactly (upstream keeps no stats at all);
- post-encode skips are counted by reason (upstream swallows ``SkipSample`` silently);
- the end of a finite source is remembered through the :class:`SourceEnd` it stands on (upstream
  restores a state saved during its final flush into a fresh epoch: every sample again);
- a worker that skips ``skip_guard`` samples without a pack raises :class:`AllSkippedError`
  naming the reasons (its :class:`SkipWatch`), instead of upstream's "Pre packer ... did not yield
  any packs" after 100 rounds (or an endless loop without packs when the stream is infinite and
  tolerance is 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from megatron.energon import SkipSample
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.wrappers.packing_dataset import PackingDataset

from energon_pack.packing import PackingStats

from .pack_restore import restore_pack
from .source_end import SourceEnd
from .stream import SkipWatch


class CountedSkip(SkipSample):
    """A post-encode skip with its reason, raised in rounds mode and counted by the wrapper."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RoundsPackingDataset(PackingDataset):
    """Energon's ``PackingDataset`` with savable stats, counted skips and finite-stream resume.

    Saved state: upstream's fields plus ``_stats_state`` (:meth:`PackingStats.state_dict`) and
    ``_emitted`` (packs yielded by this worker).

    Args:
        dataset: the pre-encoded stream; wrapped in a :class:`SourceEnd` here.
        buffer_size: samples per round (``packing_buffer_size``).
        encoder: the task encoder (``select_groups``, ``pack_selected_samples``).
        sample_encoder: ``postencode_sample``, or None.
        skips: the worker's skip guard and skip-rate warning, called after every source sample.
        worker_config: Energon's worker configuration.
        **tolerances: upstream's ``*_stateless`` flags and ``*_failure_tolerance`` counts.
    """

    _savable_fields = PackingDataset._savable_fields + ("_stats_state", "_emitted")

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        buffer_size: int,
        encoder: Any,
        sample_encoder=None,
        sample_encoder_stateless: bool = True,
        final_packer_stateless: bool = True,
        skips: SkipWatch | None = None,
        pre_packer_failure_tolerance: int = 100,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        worker_config,
    ) -> None:
        self.encoder = encoder
        self.skips = skips
        self._user_sample_encoder = sample_encoder
        guard = None if skips is None else skips.guard
        if guard is not None and pre_packer_failure_tolerance > 0:
            # Upstream stops after this many buffers without a pack; let our guard (which names the
            # skip reasons) fire first.
            pre_packer_failure_tolerance = max(pre_packer_failure_tolerance, guard // buffer_size + 2)
        source = SourceEnd(dataset, on_sample=self._after_source_sample, worker_config=worker_config)
        super().__init__(
            source,
            buffer_size,
            pre_packer=self._select,
            final_packer=self._final,
            final_packer_stateless=final_packer_stateless,
            sample_encoder=None if sample_encoder is None else self._encode,
            sample_encoder_stateless=sample_encoder_stateless,
            pre_packer_failure_tolerance=pre_packer_failure_tolerance,
            final_packer_failure_tolerance=final_packer_failure_tolerance,
            sample_encoder_failure_tolerance=sample_encoder_failure_tolerance,
            worker_config=worker_config,
        )

    def reset_state_own(self) -> None:
        super().reset_state_own()
        self.stats = PackingStats()
        self._emitted = 0

    @property
    def _stats_state(self) -> dict[str, Any]:
        return self.stats.state_dict()

    @_stats_state.setter
    def _stats_state(self, state: dict[str, Any] | None) -> None:
        self.stats = PackingStats() if state is None else PackingStats.from_state_dict(state)

    @property
    def emitted(self) -> int:
        return self._emitted

    # ------------------------------------------------------------------ the hooks upstream calls
    def _select(self, samples: list[Any]) -> list[list[Any]]:
        return self.encoder.select_groups(samples, self.stats)

    def _encode(self, sample: Any) -> Any:
        try:
            return self._user_sample_encoder(sample)
        except CountedSkip as skip:
            self.stats.record_skip(skip.reason)
            raise SkipSample() from None

    def _final(self, samples: list[Any]) -> Any:
        if not samples:  # every member failed post-encode (each counted): no pack
            raise SkipSample()
        return self.encoder.pack_selected_samples(samples)

    def __iter__(self) -> Iterator[Any]:
        for packed in super().__iter__():
            self._emitted += 1
            yield packed

    def _fill_reading_buffer(self, source_iter: Iterator, log_progress: bool = False) -> bool:
        """Upstream's fill, never with its tqdm bar (the runtime wing draws no progress; a tool draws its own)."""
        return super()._fill_reading_buffer(source_iter, log_progress=False)

    def _after_source_sample(self, sample: Any) -> None:
        if self.skips is not None:
            self.skips.after(sample, self.stats, self._emitted)

    def restore_sample(self, restore_key: Any) -> Any:
        """Rebuild one pack from its restore key.

        Upstream's ``PackingDataset.restore_sample`` (7.4.1, wrappers/packing_dataset.py lines
        381-384) strips each member's sample-encoder prefix twice, so with a ``postencode_sample``
        it always fails an assertion; this is the same logic with the prefix stripped once.
        """
        return restore_pack(self, restore_key)

    def __str__(self) -> str:
        return f"RoundsPackingDataset(buffer_size={self.buffer_size}, dataset={self.dataset})"
