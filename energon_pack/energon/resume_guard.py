"""The outermost wrapper of our loaders' streams: its state carries the resume fingerprint and a checksum.

A restore saved for another rank, world size, worker count, shard list, encoder or packing configuration is
a :class:`~energon_pack.energon.fingerprint.ResumeConfigError` naming the change; a state whose parts were
edited or removed after saving (open bins, counters, keys) fails the checksum and is refused before anything
is restored.
"""

from __future__ import annotations

from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.state import FlexState
from megatron.energon.wrappers.base import BaseWrapperDataset

from .fingerprint import GuardState, ResumeFingerprint, check_guard_state, state_checksum


class ResumeGuard(BaseWrapperDataset):
    """Pass-through whose saved state is a :class:`GuardState` over its inner states.

    Args:
        dataset: the stream to guard (our loader's whole stream).
        fingerprint: what the state is saved for (:func:`~energon_pack.energon.fingerprint.resume_fingerprint`).
        worker_config: Energon's worker configuration.
    """

    _savable_fields = ("_resume",)

    def __init__(self, dataset: SavableDataset, *, fingerprint: ResumeFingerprint, worker_config: Any) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.fingerprint = fingerprint
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._resume: GuardState | None = None

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self):
        yield from self.dataset

    def save_state(self) -> FlexState:
        inner = [ds.save_state() for ds in self.datasets]
        guard = GuardState(fingerprint=self.fingerprint, checksum=state_checksum(inner))
        return FlexState(__class__=type(self).__name__, _resume=guard, datasets=inner)

    def restore_state(self, state: FlexState | None) -> None:
        if state is not None:
            check_guard_state(state, self.fingerprint)
        super().restore_state(state)
        self._resume = None

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "fingerprint": self.fingerprint, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"ResumeGuard(dataset={self.dataset})"
