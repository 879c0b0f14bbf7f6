"""The streaming online packer: one per data-loader worker.

Every pushed item is placed at once, best-fit, into the open bin it fills most tightly (a new
bin when none fits). Open bins persist across pushes, so a bin left half full by one stretch
of the stream is topped up by the next, instead of being emitted half empty at the end of a
buffer round. A bin leaves the packer when

- it is *dead*: no item could still fit (its primary budget is exactly full, or, once
  ``TYPICAL_AFTER`` items have been seen, its room is below the smallest cost seen so far in
  some budget), or it reaches ``min_fill``;
- the look-ahead bound overflows: more than ``max_buffered`` items held (Energon's
  ``packing_buffer_size`` meaning) or more than ``lookahead_packs`` packs' worth of primary
  budget held; the fullest bin leaves first;
- it has been open for ``max_age`` pushes;
- ``flush()`` is called at the end of the stream (partial bins are emitted, none are lost).

Items larger than the capacity follow ``on_oversize``: ``skip`` (counted in ``stats.skips``
and reported by ``pop_skipped``) or ``error`` (:func:`over_capacity`, the one policy of both
streaming packers: this one and the compute-balanced one). Every pushed key leaves exactly once:
in a group or as a skip. The state is plain data (keys, costs, bin membership, counters), and a
restored packer yields exactly the same future groups.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any, Literal

import numpy as np

from .bins import Bin, OpenBins
from .costs import CostLike, as_capacity, as_cost
from .offline import OversizeError
from .stats import PackingStats

STATE_FORMAT = 1
OVERSIZE_REASON = "oversize"
#: what an item over the capacity gets (``on_oversize``)
OVERSIZE_POLICIES = ("skip", "error")
# Items seen before the smallest seen cost is trusted as "the smallest item that can come"
# (early in a stream it is still large and would close bins too soon).
TYPICAL_AFTER = 32


class OnlinePacker:
    """Streaming multi-budget packer with open bins carried across pushes (see module doc).

    Args:
        capacity: the budget of one pack: an int (tokens, i.e. ``seq_length``) or a vector of ints, one per
            budget (tokens first, then e.g. vision patches, media items).
        max_buffered: the most items held in open bins (Energon's ``packing_buffer_size`` meaning); over it, the
            fullest bin leaves. None (default): bounded by ``lookahead_packs`` only.
        lookahead_packs: the most primary budget held, in packs' worth (default 4.0 when ``max_buffered`` is
            None too): more held fills better, at the cost of memory and latency.
        min_fill: a bin leaves once this share of the primary budget is used, in (0, 1]; None: only when dead.
        max_age: pushes a bin may stay open before it leaves (bounds a sample's delay); None: no limit.
        on_oversize: an item over the capacity in some budget: ``"skip"`` (counted, :meth:`pop_skipped`) or
            ``"error"`` (:class:`OversizeError`).
        seed: the seed of :meth:`flush`'s order of the last bins.
    """

    def __init__(
        self,
        capacity: CostLike,
        *,
        max_buffered: int | None = None,
        lookahead_packs: float | None = None,
        min_fill: float | None = None,
        max_age: int | None = None,
        on_oversize: Literal["skip", "error"] = "skip",
        seed: int = 0,
    ) -> None:
        self.capacity = as_capacity(capacity)
        if max_buffered is None and lookahead_packs is None:
            lookahead_packs = 4.0
        if max_buffered is not None and (not isinstance(max_buffered, int) or max_buffered < 1):
            raise ValueError(f"max_buffered must be a positive int (samples held per worker), got {max_buffered!r}")
        if lookahead_packs is not None and not lookahead_packs > 0:
            raise ValueError(f"lookahead_packs must be > 0 (packs' worth of tokens held), got {lookahead_packs!r}")
        if min_fill is not None and not 0 < min_fill <= 1:
            raise ValueError(f"min_fill must be in (0, 1], got {min_fill!r}")
        if max_age is not None and (not isinstance(max_age, int) or max_age < 1):
            raise ValueError(f"max_age must be a positive int (pushes a bin may stay open), got {max_age!r}")
        check_oversize_policy(on_oversize)
        self.max_buffered = max_buffered
        self.lookahead_packs = lookahead_packs
        self.min_fill = min_fill
        self.max_age = max_age
        self.on_oversize = on_oversize
        self.seed = seed
        self._max_tokens = None if lookahead_packs is None else int(lookahead_packs * self.capacity[0])
        self._min_fill_tokens = None if min_fill is None else min_fill * self.capacity[0]
        self._reset()

    def _reset(self) -> None:
        self._bins = OpenBins(self.capacity)
        self._bin_of: dict[Hashable, int] = {}
        self._held_tokens = 0
        self._pushes = 0
        self._min_seen: list[int] | None = None
        self._seen = 0
        self._by_age: deque[int] = deque()
        self._skipped: list[tuple[Hashable, str]] = []
        self.stats = PackingStats()

    # ------------------------------------------------------------------ streaming
    @property
    def held(self) -> int:
        """Items currently held in open bins."""
        return len(self._bin_of)

    @property
    def held_tokens(self) -> int:
        """Primary budget currently held in open bins."""
        return self._held_tokens

    @property
    def open_bins(self) -> int:
        return len(self._bins)

    def held_keys(self) -> list[Hashable]:
        """The keys held in open bins (bins in opening order)."""
        return [key for b in self._bins for key in b.keys]

    def push(self, key: Hashable, cost: CostLike) -> list[list[Hashable]]:
        """Add one item; returns the groups (lists of keys) that are ready now, in order."""
        dims = len(self.capacity)
        cost = as_cost(cost, dims, key=key)
        if key in self._bin_of:
            raise ValueError(f"duplicate key {key!r}: it is already held by the packer")
        self._pushes += 1
        if over_capacity(key, cost, self.capacity, self.on_oversize):
            self._skipped.append((key, OVERSIZE_REASON))
            self.stats.record_skip(OVERSIZE_REASON)
            return self._emit_expired([])
        seen = self._min_seen
        self._seen += 1
        if seen is None:
            self._min_seen = list(cost)
        else:
            for d, c in enumerate(cost):
                if c < seen[d]:
                    seen[d] = c

        b = self._bins.best_fit(cost)
        if b is None:
            b = self._bins.open(opened_at=self._pushes)
            self._by_age.append(b.bin_id)
        self._bins.add(b, key, cost)
        self._bin_of[key] = b.bin_id
        self._held_tokens += cost[0]

        ready: list[list[Hashable]] = []
        if self._is_done(b):
            ready.append(self._emit(b))
        while (self.max_buffered is not None and len(self._bin_of) > self.max_buffered) or (
            self._max_tokens is not None and self._held_tokens > self._max_tokens
        ):
            ready.append(self._emit(self._bins.fullest()))
        return self._emit_expired(ready)

    def flush(self) -> list[list[Hashable]]:
        """Emit every open bin (end of a finite stream), in a seeded order; the packer is then empty."""
        bins = list(self._bins)
        order = np.random.default_rng([self.seed, self._pushes]).permutation(len(bins))
        return [self._emit(bins[i]) for i in order]

    def pop_skipped(self) -> list[tuple[Hashable, str]]:
        """Items skipped since the last call, as (key, reason)."""
        out, self._skipped = self._skipped, []
        return out

    def _is_done(self, b: Bin) -> bool:
        room = self.capacity[0] - b.used[0]
        if room == 0 or (self._min_fill_tokens is not None and b.used[0] >= self._min_fill_tokens):
            return True
        if self._seen < TYPICAL_AFTER:
            return False
        return any(c - u < m for c, u, m in zip(self.capacity, b.used, self._min_seen))

    def _emit_expired(self, ready: list[list[Hashable]]) -> list[list[Hashable]]:
        ages = self._by_age
        while ages:
            b = self._bins.get(ages[0])
            if b is None:
                ages.popleft()
            elif self.max_age is not None and self._pushes - b.opened_at >= self.max_age:
                ready.append(self._emit(b))
            else:
                break
        return ready

    def _emit(self, b: Bin) -> list[Hashable]:
        self._bins.close(b)
        for key in b.keys:
            del self._bin_of[key]
        self._held_tokens -= b.used[0]
        self.stats.record_pack(b.costs, self.capacity)
        return b.keys

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: restoring it reproduces the same future groups exactly."""
        return {
            "format": STATE_FORMAT,
            "capacity": list(self.capacity),
            "pushes": self._pushes,
            "next_bin_id": self._bins.next_id,
            "seen": self._seen,
            "min_seen": None if self._min_seen is None else list(self._min_seen),
            "bins": [[b.bin_id, b.opened_at, [[k, list(c)] for k, c in zip(b.keys, b.costs)]] for b in self._bins],
            "stats": self.stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported packer state format {state.get('format')!r}")
        if tuple(state["capacity"]) != self.capacity:
            raise ValueError(
                f"packer state was saved with capacity {state['capacity']}, this packer has "
                f"{list(self.capacity)}: exact resume needs the same width and budgets"
            )
        self._reset()
        self._pushes = state["pushes"]
        self._seen = state["seen"]
        self._min_seen = None if state["min_seen"] is None else list(state["min_seen"])
        for bin_id, opened_at, members in state["bins"]:
            b = self._bins.open(opened_at=opened_at, bin_id=bin_id)
            self._by_age.append(bin_id)
            for key, cost in members:
                key = _plain_key(key)
                self._bins.add(b, key, tuple(cost))
                self._bin_of[key] = bin_id
                self._held_tokens += cost[0]
        self._bins.next_id = state["next_bin_id"]
        self.stats = PackingStats.from_state_dict(state["stats"])


def check_oversize_policy(on_oversize: str) -> None:
    """ValueError naming ``on_oversize`` unless it is one of :data:`OVERSIZE_POLICIES`."""
    if on_oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"on_oversize must be 'skip' or 'error', got {on_oversize!r}")


def over_capacity(key: Hashable, cost: tuple[int, ...], capacity: tuple[int, ...], on_oversize: str) -> bool:
    """Whether an item of ``cost`` is over ``capacity`` in some budget and so skipped (the caller counts it);
    under ``on_oversize="error"`` such an item raises :class:`OversizeError` instead."""
    if all(c <= cap for c, cap in zip(cost, capacity)):
        return False
    if on_oversize == "error":
        raise OversizeError(
            f"item {key!r} with cost {list(cost)} exceeds capacity {list(capacity)}; "
            "set overlength='skip' (on_oversize='skip' on a packer you build) to count and skip such items"
        )
    return True


def _plain_key(key: Any) -> Hashable:
    """Keys round-trip through JSON-like state as lists; turn them back into tuples."""
    return tuple(_plain_key(k) for k in key) if isinstance(key, list) else key
