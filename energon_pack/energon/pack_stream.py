"""The wrapper above our packing layers: the one place ``packing_stats`` are stamped on a pack.

It holds the newest pack back by one so every pack carries the worker's stats as of the *next* pack: the
last pack of a finite stream carries the final counts, so no skip that happened after it goes unreported. A
held pack is checkpointed as its restore key and rebuilt with ``restore_sample`` on resume. It restores from
a private deep copy of the state (the caller's object is never mutated), and reports a worker's end of
stream (a warning when it skipped everything).
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.wrappers.base import BaseWrapperDataset, get_sample_restore_key

from .stream import all_skipped_message, worker_name

log = logging.getLogger("energon_pack")


class PackStream(BaseWrapperDataset):
    """Stats on every pack (one pack of latency), copy-on-restore, end-of-stream report.

    The wrapped packing layer exposes ``stats`` (:class:`~energon_pack.packing.PackingStats`) and
    ``emitted`` (packs yielded so far by this worker). Saved state: ``_held_key``, the restore key of the
    pack held back (None when none is).

    Args:
        dataset: the packing layer (carry-over or rounds).
        worker_config: Energon's worker configuration.
    """

    _savable_fields = ("_held_key",)

    def __init__(self, dataset: SavableDataset, *, worker_config) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._held_key: tuple | None = None

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def restore_state(self, state) -> None:
        if state is not None:
            state = copy.deepcopy(state)  # restoring must never mutate the caller's checkpoint
        super().restore_state(state)

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
            worker = self.worker_config
            identity = {"rank": worker.rank, "worker": worker.rank_worker_id() if worker.num_workers else 0}
            packed.packing_stats = {**identity, **self.dataset.stats.state_dict()}
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

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"PackStream(dataset={self.dataset})"
