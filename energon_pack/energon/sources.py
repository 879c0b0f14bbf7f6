"""Per-source accounting of a blend: which dataset each sample came from, counted in the packing stats.

A Metadataset blend (``blend:`` / ``blend_epochized:`` over several prepared datasets) mixes samples in every
worker. Each sample keeps Energon's ``__subflavors__`` and ``__sources__`` through pre-encode, packing and
post-encode (``derive_from``), so its source is known where it is counted: :func:`source_name` is the
``source`` subflavor when the Metadataset sets one, else the dataset's folder (or file) name, the same in
every worker and after a restore.

Two pass-through wrappers count into the packing layer's :class:`~energon_pack.packing.PackingStats`
(``record_source``), whose state is checkpointed with the packer, so the counts resume exactly:

- :class:`SourceSkips` below the packing layer: pre-encode skips by reason and samples over the pack's budgets
  (``oversize``), per source, as they enter the packer;
- :class:`SourceTally` above it: the members of every pack as it leaves (samples, real tokens as the pack
  counts them, i.e. aligned spans, supervised tokens and, when the encoder prices steps, the step cost the
  packer used). A pack rebuilt on restore is not counted again (it comes from ``restore_sample``). Members
  that are still pre-encoded candidates (:mod:`.plan`: no post-encode) count their packed tokens and step
  cost; their supervised tokens are not known before post-encode.

A member that fails post-encode (pixel decode) is counted in the worker's ``skips``, not per source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.wrappers.base import BaseWrapperDataset

from energon_pack.packing import PackingStats

from .samples import PackedSamples, SkippedSample

#: the subflavor key that names a source (``subflavors: {source: photos}`` in a Metadataset entry)
SOURCE_SUBFLAVOR = "source"


def source_name(sample: Any) -> str:
    """The name of the dataset ``sample`` came from: its ``source`` subflavor, else its dataset's folder name."""
    subflavors = getattr(sample, "__subflavors__", None) or {}
    if SOURCE_SUBFLAVOR in subflavors:
        return str(subflavors[SOURCE_SUBFLAVOR])
    sources = getattr(sample, "__sources__", None)
    if sources:
        return str(sources[0].dataset_path).rstrip("/").rsplit("/", 1)[-1]
    return "unknown"


class _PassThrough(BaseWrapperDataset):
    """A stateless wrapper that only looks at the samples going by."""

    _savable_fields = ()

    def reset_state_own(self) -> None:
        pass

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"{type(self).__name__}(dataset={self.dataset})"


class SourceSkips(_PassThrough):
    """Below the packing layer: each pre-encode skip, and each sample over ``capacity``, counted on its source.

    Args:
        dataset: the pre-encoded stream.
        capacity: the pack's budgets (a candidate over any is the packer's ``oversize`` skip).
        counts_oversize: False when over-budget samples raise instead (``overlength="error"``).
        worker_config: Energon's worker configuration.
    """

    def __init__(
        self, dataset: SavableDataset, *, capacity: tuple[int, ...], counts_oversize: bool, worker_config
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.capacity = tuple(capacity)
        self.counts_oversize = counts_oversize
        self.stats: Callable[[], PackingStats] = PackingStats  # set to the packing layer's stats by the encoder

    def __iter__(self) -> Iterator[Any]:
        for sample in self.dataset:
            if isinstance(sample, SkippedSample):
                self.stats().record_source(source_name(sample), {f"skip:{sample.reason}": 1})
            elif self.counts_oversize and any(c > cap for c, cap in zip(getattr(sample, "cost", ()), self.capacity)):
                self.stats().record_source(source_name(sample), {"skip:oversize": 1})
            yield sample


class SourceTally(_PassThrough):
    """Above the packing layer: every pack's members counted on their sources as the pack leaves.

    Exposes the layer's ``stats`` and ``emitted`` (what :class:`~.pack_stream.PackStream` reads).

    Args:
        dataset: the packing layer (carry-over or rounds).
        span: a segment's length -> its aligned span (what the pack's ``real_tokens`` count).
        step_cost: one member (post-encoded, or a candidate) -> its step cost; None when the encoder prices none.
        worker_config: Energon's worker configuration.
    """

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        span: Callable[[int], int],
        step_cost: Callable[[Any], float] | None,
        worker_config,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.span = span
        self.step_cost = step_cost

    @property
    def stats(self) -> PackingStats:
        return self.dataset.stats

    @property
    def emitted(self) -> int:
        return self.dataset.emitted

    def __iter__(self) -> Iterator[Any]:
        for packed in self.dataset:
            for member in packed.samples if isinstance(packed, PackedSamples) else [packed]:
                segment = getattr(member, "segment", None)
                if segment is not None:
                    tokens, supervised = self.span(len(segment.input_ids)), int(segment.loss_mask.sum())
                    counts = {"samples": 1, "real_tokens": tokens, "supervised_tokens": supervised}
                elif hasattr(member, "cost"):  # a pre-encoded candidate (an epoch plan): its tokens as packed
                    counts = {"samples": 1, "real_tokens": int(member.cost[0])}
                else:
                    continue
                if self.step_cost is not None:
                    counts["step_cost"] = float(self.step_cost(member))
                self.stats.record_source(source_name(member), counts)
            yield packed
