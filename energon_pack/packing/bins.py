"""A set of open bins indexed by remaining room, for best-fit placement.

Shared by offline best-fit-decreasing and the streaming :class:`OnlinePacker`. Bins are kept
in a ``SortedList`` keyed by (remaining primary budget, bin id), so the tightest bin that can
take an item is found by bisection in O(log n); other budgets are checked while walking up
from there (only bins that fit the primary budget are visited). Ties break by bin id, which
makes placement deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from sortedcontainers import SortedList

from .costs import Cost


class Bin:
    """One open bin: its members (keys and costs) and the budget used so far."""

    __slots__ = ("bin_id", "opened_at", "keys", "costs", "used")

    def __init__(self, bin_id: int, opened_at: int, dims: int) -> None:
        self.bin_id = bin_id
        self.opened_at = opened_at
        self.keys: list[Hashable] = []
        self.costs: list[Cost] = []
        self.used = [0] * dims


class OpenBins:
    """Open bins with a best-fit index over their remaining room."""

    def __init__(self, capacity: Cost) -> None:
        self.capacity = capacity
        self._bins: dict[int, Bin] = {}
        self._by_room = SortedList()
        self.next_id = 0

    def __len__(self) -> int:
        return len(self._bins)

    def __iter__(self) -> Iterator[Bin]:
        """Bins in opening order (ascending id)."""
        return iter(sorted(self._bins.values(), key=lambda b: b.bin_id))

    def best_fit(self, cost: Cost) -> Bin | None:
        """The bin with the least primary room that still fits ``cost`` in every budget."""
        index = self._by_room
        start = index.bisect_left((cost[0], -1))
        if len(cost) == 1:
            return self._bins[index[start][1]] if start < len(index) else None
        capacity = self.capacity
        for i in range(start, len(index)):
            b = self._bins[index[i][1]]
            if all(c + u <= cap for c, u, cap in zip(cost, b.used, capacity)):
                return b
        return None

    def open(self, opened_at: int, bin_id: int | None = None) -> Bin:
        if bin_id is None:
            bin_id = self.next_id
        self.next_id = max(self.next_id, bin_id + 1)
        b = Bin(bin_id, opened_at, len(self.capacity))
        self._bins[bin_id] = b
        self._by_room.add((self.capacity[0], bin_id))
        return b

    def add(self, b: Bin, key: Hashable, cost: Cost) -> None:
        self._by_room.remove((self.capacity[0] - b.used[0], b.bin_id))
        b.keys.append(key)
        b.costs.append(cost)
        b.used = [u + c for u, c in zip(b.used, cost)]
        self._by_room.add((self.capacity[0] - b.used[0], b.bin_id))

    def close(self, b: Bin) -> Bin:
        self._by_room.remove((self.capacity[0] - b.used[0], b.bin_id))
        del self._bins[b.bin_id]
        return b

    def fullest(self) -> Bin:
        """The bin with the least primary room (the oldest among equals)."""
        return self._bins[self._by_room[0][1]]

    def get(self, bin_id: int) -> Bin | None:
        return self._bins.get(bin_id)
