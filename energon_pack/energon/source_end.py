"""The wrapper below our packing layers that remembers, in the checkpoint, that a finite source has ended.

Energon's sample loader resets itself to "start a new epoch" the moment its last sample is read, so a state
saved while the packer is still flushing its last packs would otherwise restore into a fresh epoch: the
remaining packs, then every sample again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.wrappers.base import BaseWrapperDataset


class SourceEnd(BaseWrapperDataset):
    """Pass-through that records in its state (``_done``) that the source has ended for this pass.

    ``_done`` stays set after the pass (a worker that finished its share checkpoints "done", not "fresh").
    The next ``iter`` starts a new pass, unless the state was just restored: then the pass it belongs to is
    already read and the source yields nothing (the packing layer above only drains what it still holds).

    Args:
        dataset: the pre-encoded source stream.
        on_sample: called with each source sample once the layer above has consumed it (when it asks for
            the next one); the packing layer's skip checks.
        worker_config: Energon's worker configuration.
    """

    _savable_fields = ("_done",)

    def __init__(
        self, dataset: SavableDataset, *, on_sample: Callable[[Any], None] | None = None, worker_config
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.on_sample = on_sample
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
                self.on_sample(sample)
        self._done = True

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"SourceEnd(dataset={self.dataset})"
