"""Packing telemetry: real used tokens (not capacity), fill histogram, samples per pack, skips, adjustments.

One :class:`PackingStats` per worker; ``merge`` adds another worker's stats, so a trainer
can report the fill of all ranks and workers. Everything is plain data (``state_dict``) so
stats survive a checkpoint together with the packer.

Adjustments count samples that were kept by changing them (``overlength="fit"`` / ``"split"``), never skips:
``fitted`` samples with ``fit_pixels_before`` / ``fit_pixels_after`` (their media's resized pixels, every frame of a
video counted), ``split`` conversations with ``split_pieces`` delivered and ``split_dropped_pieces`` (pieces whose
turns hold no supervised token: nothing to train).

Per source (a blend's datasets, by the name :func:`energon_pack.energon.sources.source_name` gives), ``sources``
counts the samples delivered in packs with their real and supervised tokens and the step cost the packer used, and
the skips by reason (``skip:<reason>``), so a blend's token and compute shares are known after packing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FILL_BUCKETS = 20  # histogram of pack fill in 5% steps; the last bucket is [95%, 100%]


@dataclass
class PackingStats:
    """Counters over emitted packs. ``slots`` counts capacity of the primary budget per pack."""

    packs: int = 0
    samples: int = 0
    real_tokens: int = 0
    slots: int = 0
    budget_used: list[int] = field(default_factory=list)
    fill_histogram: list[int] = field(default_factory=lambda: [0] * FILL_BUCKETS)
    samples_per_pack: Counter = field(default_factory=Counter)
    skips: Counter = field(default_factory=Counter)
    adjustments: Counter = field(default_factory=Counter)
    sources: dict[str, Counter] = field(default_factory=dict)

    @property
    def fill(self) -> float:
        """Real tokens over physical slots (0.0 before the first pack)."""
        return self.real_tokens / self.slots if self.slots else 0.0

    @property
    def skipped(self) -> int:
        return sum(self.skips.values())

    @property
    def mean_samples_per_pack(self) -> float:
        return self.samples / self.packs if self.packs else 0.0

    def record_pack(self, costs: Iterable[tuple[int, ...]], capacity: tuple[int, ...]) -> None:
        costs = list(costs)
        used = [sum(c[d] for c in costs) for d in range(len(capacity))]
        self.packs += 1
        self.samples += len(costs)
        self.real_tokens += used[0]
        self.slots += capacity[0]
        if not self.budget_used:
            self.budget_used = [0] * len(capacity)
        self.budget_used = [a + b for a, b in zip(self.budget_used, used)]
        bucket = min(FILL_BUCKETS - 1, used[0] * FILL_BUCKETS // capacity[0])
        self.fill_histogram[bucket] += 1
        self.samples_per_pack[len(costs)] += 1

    def record_skip(self, reason: str, count: int = 1) -> None:
        self.skips[reason] += count

    def record_adjustment(self, counts: dict[str, int]) -> None:
        """Add a kept sample's adjustment counters (e.g. ``{"fitted": 1, "fit_pixels_before": ..}``)."""
        self.adjustments.update(counts)

    def record_source(self, source: str, counts: dict[str, float]) -> None:
        """Add counters to one source: ``samples``, ``real_tokens``, ``supervised_tokens``, ``step_cost`` of the
        samples it delivered, or ``skip:<reason>``."""
        self.sources.setdefault(source, Counter()).update(counts)

    def per_source(self) -> dict[str, dict[str, Any]]:
        """Each source's delivered samples and tokens, its shares of all sources' real tokens and step cost, its
        contribution to :attr:`fill` (its real tokens over all slots) and its skips by reason."""
        total_tokens = sum(c["real_tokens"] for c in self.sources.values())
        total_cost = sum(c["step_cost"] for c in self.sources.values())
        out = {}
        for name, c in sorted(self.sources.items()):
            out[name] = {
                "samples": c["samples"],
                "real_tokens": c["real_tokens"],
                "supervised_tokens": c["supervised_tokens"],
                "token_share": round(c["real_tokens"] / total_tokens, 6) if total_tokens else 0.0,
                "cost_share": round(c["step_cost"] / total_cost, 6) if total_cost else None,  # None: no step cost
                "fill_contribution": round(c["real_tokens"] / self.slots, 6) if self.slots else 0.0,
                "skips": {k[5:]: v for k, v in sorted(c.items()) if k.startswith("skip:") and v},
            }
        return out

    def merge(self, other: PackingStats) -> PackingStats:
        """A new stats object counting both ``self`` and ``other`` (e.g. two workers)."""
        width = max(len(self.budget_used), len(other.budget_used))
        pad = lambda v: list(v) + [0] * (width - len(v))  # noqa: E731
        return PackingStats(
            packs=self.packs + other.packs,
            samples=self.samples + other.samples,
            real_tokens=self.real_tokens + other.real_tokens,
            slots=self.slots + other.slots,
            budget_used=[a + b for a, b in zip(pad(self.budget_used), pad(other.budget_used))],
            fill_histogram=[a + b for a, b in zip(self.fill_histogram, other.fill_histogram)],
            samples_per_pack=self.samples_per_pack + other.samples_per_pack,
            skips=self.skips + other.skips,
            adjustments=self.adjustments + other.adjustments,
            sources={
                name: self.sources.get(name, Counter()) + other.sources.get(name, Counter())
                for name in {*self.sources, *other.sources}
            },
        )

    def summary(self) -> dict[str, Any]:
        """A flat dict for logs and JSON reports."""
        return {
            "packs": self.packs,
            "samples": self.samples,
            "real_tokens": self.real_tokens,
            "slots": self.slots,
            "fill": round(self.fill, 6),
            "mean_samples_per_pack": round(self.mean_samples_per_pack, 3),
            "skipped": self.skipped,
            "skips": dict(sorted(self.skips.items())),
            "adjustments": dict(sorted(self.adjustments.items())),
            **({"sources": self.per_source()} if self.sources else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "packs": self.packs,
            "samples": self.samples,
            "real_tokens": self.real_tokens,
            "slots": self.slots,
            "budget_used": list(self.budget_used),
            "fill_histogram": list(self.fill_histogram),
            "samples_per_pack": sorted(self.samples_per_pack.items()),
            "skips": sorted(self.skips.items()),
            "adjustments": sorted(self.adjustments.items()),
            "sources": {name: sorted(c.items()) for name, c in sorted(self.sources.items())},
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PackingStats:
        return cls(
            packs=state["packs"],
            samples=state["samples"],
            real_tokens=state["real_tokens"],
            slots=state["slots"],
            budget_used=list(state["budget_used"]),
            fill_histogram=list(state["fill_histogram"]),
            samples_per_pack=Counter(dict(state["samples_per_pack"])),
            skips=Counter(dict(state["skips"])),
            adjustments=Counter(dict(state.get("adjustments", ()))),  # absent from states saved before fit/split
            sources={name: Counter(dict(c)) for name, c in state.get("sources", {}).items()},  # absent before blends
        )


class PackingStatsTracker:
    """One view of the stats of every loader worker, from the snapshots that batches carry.

    Each batch holds ``packing_stats``: the cumulative stats of the worker that built it, with
    its ``rank`` and ``worker``. Feed every batch's snapshot to :meth:`update`; :attr:`total`
    merges the latest snapshot of each worker (gather ``state_dict()`` across ranks to see a
    whole job).

    Takes no arguments: it starts empty and learns the workers from the snapshots it is fed.
    """

    def __init__(self) -> None:
        self._latest: dict[tuple, dict[str, Any]] = {}

    def update(self, snapshot: dict[str, Any] | None) -> None:
        if snapshot is not None:
            self._latest[(snapshot.get("rank"), snapshot.get("worker"))] = snapshot

    def per_worker(self) -> dict[tuple, PackingStats]:
        return {key: PackingStats.from_state_dict(s) for key, s in sorted(self._latest.items(), key=str)}

    @property
    def total(self) -> PackingStats:
        total = PackingStats()
        for stats in self.per_worker().values():
            total = total.merge(stats)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {"latest": [[list(k), v] for k, v in self._latest.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._latest = {tuple(k): v for k, v in state["latest"]}
