"""A savable Energon wrapper that packs with open bins carried across buffer rounds.

Energon's ``PackingDataset`` partitions each buffer of fresh samples and emits every group,
so tail bins leave half empty every round. This wrapper drives :class:`OnlinePacker` over
the pre-encoded stream instead: every sample is placed best-fit into an open bin as it
arrives, and a bin leaves only when it is full, the buffer bound overflows, or the stream
ends. ``postencode_sample`` (pixel decoding) runs only on the members of an emitted pack.

Checkpoint state is plain data: the restore keys of every held sample (a
``SavableSampleBuffer``), their packer slots, the packer's bins/costs/stats and the groups
already emitted by the packer but not yet yielded. Restoring re-reads and re-pre-encodes
the held samples and yields exactly the same next packs. The wrapper stands on a
:class:`SourceEnd` (a finite stream's end survives a restore) that calls its :class:`SkipWatch`
after every source sample.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from typing import Any

from megatron.energon.errors import ErrorContext
from megatron.energon.flavors.base_dataset import SavableDataset, add_sample_restore_key, set_sample_restore_key
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.base import BaseWrapperDataset, SampleIndex, get_sample_restore_key
from megatron.energon.wrappers.buffer import SavableSampleBuffer

from energon_pack.errors import SampleSkipped
from energon_pack.packing import OnlinePacker
from energon_pack.packing.costs import Cost

from .fingerprint import ResumeConfigError
from .pack_restore import restore_pack
from .samples import SkippedSample
from .source_end import SourceEnd
from .stream import SkipWatch


class CarryOverPackingDataset(BaseWrapperDataset):
    """Streams packs of pre-encoded samples chosen by a per-worker :class:`OnlinePacker`.

    Saved state (``_savable_fields``): the held samples' restore keys and packer slots, the next slot,
    the packs emitted by the packer but not yet yielded, the packer's state, the two sample indexes and
    the packs yielded so far.

    Args:
        dataset: the pre-encoded stream; wrapped in a :class:`SourceEnd` here.
        make_packer: a fresh :class:`OnlinePacker` (capacity, buffer bound, packer knobs), or a
            :class:`~energon_pack.packing.balanced.ComputeBalancedPacker` (then ``step_cost_fn`` is given).
        cost_fn: one pre-encoded sample's cost in every budget.
        step_cost_fn: one pre-encoded sample's step cost, for a compute-balanced packer; None otherwise.
        final_packer: the members of one pack -> the pack (``pack_selected_samples``).
        final_packer_stateless: ``final_packer`` is ``@stateless`` (packs can be restored from their keys).
        sample_encoder: ``postencode_sample`` run on each member of an emitted pack, or None.
        sample_encoder_stateless: ``sample_encoder`` is ``@stateless``.
        final_packer_failure_tolerance: Energon's failure tolerance of ``final_packer``.
        sample_encoder_failure_tolerance: Energon's failure tolerance of ``sample_encoder``.
        skips: the worker's skip guard and skip-rate warning, called after every source sample.
        worker_config: Energon's worker configuration.
    """

    _savable_fields = (
        "_held",
        "_held_slots",
        "_next_slot",
        "_pending",
        "_packer_state",
        "_sample_encoder_sample_index",
        "_final_packing_sample_index",
        "_emitted",
    )

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        make_packer: Callable[[], OnlinePacker],
        cost_fn: Callable[[Any], Cost],
        step_cost_fn: Callable[[Any], float] | None = None,
        final_packer: Callable[[list[Any]], Any],
        final_packer_stateless: bool,
        sample_encoder: Callable[[Any], Any] | None = None,
        sample_encoder_stateless: bool = True,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        skips: SkipWatch | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(
            SourceEnd(dataset, on_sample=self._after_source_sample, worker_config=worker_config),
            worker_config=worker_config,
        )
        self.make_packer = make_packer
        self.cost_fn = cost_fn
        self.step_cost_fn = step_cost_fn
        self.final_packer = final_packer
        self.final_packer_stateless = final_packer_stateless
        self.sample_encoder = sample_encoder
        self.sample_encoder_stateless = sample_encoder_stateless
        self.skips = skips
        self._final_failures = ErrorContext(
            name=f"CarryOverPackingDataset.{final_packer}",
            handler=worker_config.global_error_handler,
            tolerance=final_packer_failure_tolerance,
        )
        self._encoder_failures = ErrorContext(
            name=f"CarryOverPackingDataset.{sample_encoder}",
            handler=worker_config.global_error_handler,
            tolerance=sample_encoder_failure_tolerance,
        )
        self.reset_state_own()

    # ------------------------------------------------------------------ state
    def reset_state_own(self) -> None:
        self._packer = self.make_packer()
        self._held = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        self._held_slots: list[int] = []
        self._next_slot = 0
        self._pending: list[list[int]] = []
        self._sample_encoder_sample_index = SampleIndex(self.worker_config, src=self)
        self._final_packing_sample_index = SampleIndex(self.worker_config, src=self)
        self._emitted = 0

    @property
    def _packer_state(self) -> dict[str, Any]:
        return self._packer.state_dict()

    @_packer_state.setter
    def _packer_state(self, state: dict[str, Any] | None) -> None:
        self._packer = self.make_packer()
        if state is not None:
            self._packer.load_state_dict(state)

    @property
    def stats(self):
        """This worker's :class:`PackingStats` (packs, fill, skips by reason)."""
        return self._packer.stats

    def len_worker(self, worker_idx: int | None = None) -> int:
        # The number of packs depends on the data; like Energon's PackingDataset we report
        # the number of source samples.
        return self.dataset.len_worker(worker_idx)

    # ------------------------------------------------------------------ streaming
    @property
    def emitted(self) -> int:
        """Packs this worker has yielded (a pack whose members all failed post-encode is not one)."""
        return self._emitted

    def __iter__(self) -> Iterator[Any]:
        self._held.worker_start()
        self._check_consistent()
        yield from self._drain()
        # A restored state saved while the last packs of a finite stream were flushed has the
        # SourceEnd marked done: the source yields nothing and the flush below completes.
        for sample in self.dataset:
            if isinstance(sample, SkippedSample):
                self._packer.stats.record_skip(sample.reason)
                continue
            try:
                cost = self.cost_fn(sample)
                step_cost = None if self.step_cost_fn is None else self.step_cost_fn(sample)
            except SampleSkipped as skip:
                self._packer.stats.record_skip(skip.reason)
                continue
            slot = self._next_slot
            self._next_slot += 1
            self._held.append(sample)
            self._held_slots.append(slot)
            if step_cost is None:
                self._pending.extend(self._packer.push(slot, cost))
            else:
                self._pending.extend(self._packer.push(slot, cost, step_cost))
            for skipped_slot, _reason in self._packer.pop_skipped():
                self._take(skipped_slot)  # counted in the packer's stats
            yield from self._drain()
        self._pending.extend(self._packer.flush())
        yield from self._drain()

    def _check_consistent(self) -> None:
        """Refuse a state whose held samples are not exactly the members of its open bins and pending packs."""
        placed = sorted(self._packer.held_keys() + [slot for group in self._pending for slot in group])
        if len(self._held.buffer) != len(self._held_slots) or placed != sorted(self._held_slots):
            raise ResumeConfigError(
                "checkpoint",
                f"the carry-over state holds {len(self._held.buffer)} sample keys for "
                f"{len(self._held_slots)} slots, but its open bins and pending packs place {len(placed)} slots, so "
                "some held samples would never be delivered",
                "restore an unmodified checkpoint, or start a new run without restoring the loader state",
            )

    def _after_source_sample(self, sample: Any) -> None:
        """Called by the source once a sample is placed (or skipped) and its packs are yielded."""
        if self.skips is not None:
            self.skips.after(sample, self._packer.stats, self._emitted)

    def _take(self, slot: int) -> Any:
        index = self._held_slots.index(slot)
        sample = self._held[index]
        del self._held[index]
        del self._held_slots[index]
        return sample

    def _drain(self) -> Generator[Any, None, None]:
        """Yield the packs the packer has emitted; each leaves the state before it is yielded."""
        while self._pending:
            members = [self._take(slot) for slot in self._pending.pop(0)]
            pack = self._encode_members(members)
            if not pack:
                continue
            packed = None
            with self._final_failures.handle_errors(pack):
                restore_keys = tuple(get_sample_restore_key(s) for s in pack)
                with self._final_packing_sample_index.ctx() as pack_idx:
                    packed = self.final_packer(pack)
                assert not inspect.isgenerator(packed), "generator final packers are not supported"
            if packed is None:  # the final packer failed and Energon's handler logged it
                self._packer.stats.record_skip("final_pack_error", len(pack))
                continue
            self._emitted += 1  # packing_stats are stamped above, when the pack is yielded (PackStream)
            yield set_sample_restore_key(packed, pack_idx, *restore_keys, src=self)

    def _encode_members(self, members: list[Any]) -> list[Any]:
        """Post-encode (decode pixels) the members of one pack; failures become counted skips."""
        if self.sample_encoder is None:
            return members
        encoded = []
        for sample in members:
            out, reason = None, "postencode_error"
            with self._encoder_failures.handle_errors(sample):
                with self._sample_encoder_sample_index.ctx() as encode_idx:
                    try:
                        out = self.sample_encoder(sample)
                    except SampleSkipped as skip:
                        reason = skip.reason
                if out is not None:
                    out = add_sample_restore_key(out, encode_idx, src=self)
            if out is None:
                self._packer.stats.record_skip(reason)
            else:
                encoded.append(out)
        return encoded

    # ------------------------------------------------------------------ restore one pack
    def can_restore_sample(self) -> bool:
        return super().can_restore_sample() and self.final_packer_stateless and self.sample_encoder_stateless

    def assert_can_restore(self) -> None:
        assert self.final_packer_stateless and self.sample_encoder_stateless, (
            f"final packer {self.final_packer} and sample encoder {self.sample_encoder} must be @stateless"
        )
        super().assert_can_restore()

    def restore_sample(self, restore_key: Any) -> Any:
        return restore_pack(self, restore_key)

    def config(self) -> dict[str, Any]:
        packer = self.make_packer()
        return {
            "type": type(self).__qualname__,
            "capacity": list(packer.capacity),
            "max_buffered": packer.max_buffered,
            "lookahead_packs": packer.lookahead_packs,
            "min_fill": packer.min_fill,
            "max_age": packer.max_age,
            "final_packer": self._function_config(self.final_packer),
            "sample_encoder": None if self.sample_encoder is None else self._function_config(self.sample_encoder),
            "worker_config": self.worker_config.config(),
            "dataset": self.dataset.config(),
        }

    def __str__(self) -> str:
        return f"CarryOverPackingDataset(packer={self.make_packer().capacity}, dataset={self.dataset})"
