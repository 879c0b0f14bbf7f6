"""InBatchPacker: a collate function turning one micro-batch of samples into ONE THD row.

The micro-batch is whatever the sampler grouped (with :class:`TokenBudgetBatchSampler`, a set
that fits the width). Each sample becomes a :class:`ThdSegment` (labels shifted inside it) and
:func:`build_thd_batch` lays the row out per docs/concepts/batch_contract.md: alignment gaps, optional fixed width,
static cu_seqlens. Synthetic padding samples (key :data:`PADDING_KEY`) always get an all-zero
loss mask, whatever their target mask says; ``padding_segments`` counts them and
``real_tokens`` excludes them.

Every batch carries ``packing_stats`` (the Energon batches' format, ``rank``/``worker`` None: one
plan for all ranks): with ``sampler=`` its epoch plan (packs, fill, skips: the dataset's reasons
+ ``oversize``), else the dataset's skips alone; a worker process holds the snapshot taken when
it started.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..packing import PackingStats
from ..packing.spec import PackingSpec, accepts_old_names, spec_for
from ..thd import ThdLayout, ThdSegment, build_thd_batch
from .dataset import PADDING_KEY
from .formats import Encoded

#: the PackingSpec knobs that shape a row (besides ``seq_length``), taken by :meth:`InBatchPacker.for_dataset`
LAYOUT_KNOBS = ("cp", "tp", "sp", "eval_cp", "pad_to_max_length", "pad_cu_seqlens", "max_segments")


class InBatchPacker:
    """``collate_fn`` for a DataLoader over :class:`JsonlSFTDataset` with a token-budget batch sampler.

    Args:
        layout: the row layout (pack width ``seq_length``, alignment, fixed width, static cu_seqlens); build it
            with the dataset tokenizer's pad id, or use :meth:`for_dataset`.
        sampler: the :class:`TokenBudgetBatchSampler` whose epoch plan stats each batch carries; None: none.
        dataset: the dataset whose skip counts each batch carries when there is no sampler; None: none.
    """

    def __init__(self, layout: ThdLayout, *, sampler: Any = None, dataset: Any = None) -> None:
        if not isinstance(layout, ThdLayout):
            raise ConfigError(
                "layout",
                f"expected a ThdLayout, got {type(layout).__name__}",
                "use InBatchPacker.for_dataset(ds, seq_length, ...) or pass "
                "ThdLayout(seq_length=..., pad_token_id=...)",
            )
        self.layout = layout
        self.sampler, self.dataset = sampler, dataset  # where packing_stats come from (module docstring)

    @classmethod
    @accepts_old_names
    def for_dataset(
        cls,
        dataset: Any,
        seq_length: int,
        *,
        sampler: Any = None,
        **knobs: Any,
    ) -> InBatchPacker:
        """The packer for ``dataset`` with the layout knobs of :class:`~energon_pack.packing.spec.PackingSpec`
        (documented there; old names such as ``width`` and ``pad_multiple`` accepted with one DeprecationWarning).

        Args:
            dataset: the :class:`JsonlSFTDataset` (its ``pad_token_id``; its skips when there is no sampler).
            seq_length: the pack width (the sampler's).
            knobs: the spec's layout knobs (:data:`LAYOUT_KNOBS`: the sampler's alignment, fixed width, static
                cu_seqlens).
            sampler: the :class:`TokenBudgetBatchSampler` whose plan stats batches carry; None: the dataset's skips.
        """
        spec = spec_for("InBatchPacker.for_dataset", knobs, LAYOUT_KNOBS, seq_length=seq_length)
        return cls.from_spec(dataset, spec, sampler=sampler)

    @classmethod
    def from_spec(cls, dataset: Any, spec: PackingSpec, *, sampler: Any = None) -> InBatchPacker:
        """The packer of ``spec``'s row layout, with the dataset tokenizer's pad id."""
        return cls(ThdLayout.from_spec(spec, pad_token_id=dataset.pad_token_id), sampler=sampler, dataset=dataset)

    def packing_stats(self) -> dict | None:
        """What each batch carries as ``packing_stats`` (None without a sampler or dataset)."""
        if "_snapshot" in self.__dict__:
            return dict(self._snapshot)
        if self.sampler is not None:
            return {"rank": None, "worker": None, **self.sampler.stats.state_dict()}
        if self.dataset is not None:  # the dataset's skips never change: counted once
            self._snapshot = {
                "rank": None,
                "worker": None,
                **PackingStats(skips=Counter(self.dataset.skips)).state_dict(),
            }
            return dict(self._snapshot)
        return None

    def __getstate__(self) -> dict:
        # a worker gets the stats snapshot, not the sampler's plan or a second copy of the dataset
        return {**self.__dict__, "sampler": None, "dataset": None, "_snapshot": self.packing_stats()}

    def __call__(self, samples: Sequence[Encoded]) -> dict:
        if len(samples) == 0:
            raise ValueError("InBatchPacker got an empty micro-batch")
        segments = []
        for s in samples:
            is_pad = s.key == PADDING_KEY
            target = torch.zeros(len(s.input_ids), dtype=torch.bool) if is_pad else torch.from_numpy(s.target_mask)
            segments.append(
                ThdSegment.from_target_mask(
                    torch.from_numpy(s.input_ids), target, ignore_index=self.layout.ignore_index, key=s.key
                )
            )
        spans = sum(self.layout.segment_span(len(s)) for s in segments)
        if spans > self.layout.seq_length:
            raise ValueError(
                f"micro-batch of {len(segments)} samples needs {spans} tokens > width {self.layout.seq_length}: "
                "group indices with TokenBudgetBatchSampler (same width and pad_multiple) instead of a fixed batch size"
            )
        batch = build_thd_batch(segments, self.layout)
        pad_tokens = sum(len(seg) for seg in segments if seg.key == PADDING_KEY)
        batch["padding_segments"] = sum(seg.key == PADDING_KEY for seg in segments)
        batch["real_tokens"] -= pad_tokens
        batch["packing_stats"] = self.packing_stats()
        return batch
