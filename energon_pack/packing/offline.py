"""Offline bin packing over multi-budget costs: first-fit- and best-fit-decreasing.

Both sort items by decreasing size (the sum of their budget shares of the capacity, stable,
so equal items keep their input order) and place them greedily:

- first fit: the lowest-numbered bin with room, found with a max segment tree over the
  remaining room of every possible bin (one leaf per item), O(n log n) for one budget;
- best fit: the bin left with the least primary room, found by bisection (see ``bins``).

With several budgets the segment tree prunes by the per-budget maxima of a subtree; it only
backtracks where one subtree has room in every budget but no single bin that has it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .bins import OpenBins
from .costs import Cost, CostLike, as_capacity, as_cost_matrix

OversizePolicy = Literal["error", "skip"]


class OversizeError(ValueError):
    """An item is larger than the capacity in some budget and the policy is ``error``."""


@dataclass
class BinPacking:
    """Result of an offline packing: groups of item indices, and the indices skipped as oversize."""

    groups: list[list[int]]
    skipped: list[int] = field(default_factory=list)


def decreasing_order(costs: np.ndarray, capacity: Cost) -> np.ndarray:
    """Item indices by decreasing size (sum of budget shares), stable for equal sizes."""
    if len(costs) == 0:
        return np.zeros(0, dtype=np.int64)
    share = (costs / np.asarray(capacity, dtype=np.float64)).sum(axis=1)
    return np.argsort(-share, kind="stable")


def _validated(
    costs: Sequence[CostLike] | np.ndarray, capacity: CostLike, on_oversize: OversizePolicy
) -> tuple[Cost, np.ndarray, np.ndarray]:
    """(capacity, cost matrix, oversize flags); raises for bad input or oversize with ``error``."""
    if on_oversize not in ("error", "skip"):
        raise ValueError(f"on_oversize must be 'error' or 'skip', got {on_oversize!r}")
    cap = as_capacity(capacity)
    arr = as_cost_matrix(costs, len(cap))
    too_big = (arr > np.asarray(cap)).any(axis=1)
    if too_big.any() and on_oversize == "error":
        i = int(np.argmax(too_big))
        raise OversizeError(
            f"item {i} with cost {arr[i].tolist()} exceeds capacity {list(cap)}; "
            "set overlength='skip' (on_oversize='skip' on a packer you build) to count and skip such items"
        )
    return cap, arr, too_big


def first_fit_decreasing(
    costs: Sequence[CostLike] | np.ndarray, capacity: CostLike, *, on_oversize: OversizePolicy = "error"
) -> BinPacking:
    """Pack items into as few bins as first-fit-decreasing finds; groups list item indices."""
    cap, arr, too_big = _validated(costs, capacity, on_oversize)
    order = [int(i) for i in decreasing_order(arr, cap) if not too_big[i]]
    tree = _RoomTree(len(order), cap)
    groups: list[list[int]] = []
    for i in order:
        cost = tuple(int(c) for c in arr[i])
        leaf = tree.first_fit(cost)
        tree.consume(leaf, cost)
        if leaf == len(groups):
            groups.append([])
        groups[leaf].append(i)
    return BinPacking(groups, [int(i) for i in np.flatnonzero(too_big)])


def best_fit_decreasing(
    costs: Sequence[CostLike] | np.ndarray, capacity: CostLike, *, on_oversize: OversizePolicy = "error"
) -> BinPacking:
    """Pack items into the tightest bin that fits, largest first; groups list item indices."""
    cap, arr, too_big = _validated(costs, capacity, on_oversize)
    bins = OpenBins(cap)
    for i in decreasing_order(arr, cap):
        if too_big[i]:
            continue
        cost = tuple(int(c) for c in arr[i])
        b = bins.best_fit(cost) or bins.open(opened_at=int(i))
        bins.add(b, int(i), cost)
    return BinPacking([list(b.keys) for b in bins], [int(i) for i in np.flatnonzero(too_big)])


class _RoomTree:
    """Max segment tree over the remaining room of ``n`` bins, one array per budget."""

    def __init__(self, n: int, capacity: Cost) -> None:
        size = 1
        while size < max(n, 1):
            size *= 2
        self.size = size
        # Leaves beyond n never get used; keep them at capacity too, harmless because the
        # leftmost fitting leaf is always < n (each item can open its own bin).
        self.room = [[c] * (2 * size) for c in capacity]

    def first_fit(self, cost: Cost) -> int:
        """Leftmost leaf whose room fits ``cost`` in every budget."""
        stack = [1]
        room = self.room
        while stack:
            node = stack.pop()
            if any(r[node] < c for r, c in zip(room, cost)):
                continue
            if node >= self.size:
                return node - self.size
            stack.append(2 * node + 1)
            stack.append(2 * node)
        raise AssertionError("no leaf fits; oversize items must be removed first")

    def consume(self, leaf: int, cost: Cost) -> None:
        node = leaf + self.size
        for r, c in zip(self.room, cost):
            r[node] -= c
        node //= 2
        while node:
            for r in self.room:
                a, b = r[2 * node], r[2 * node + 1]
                r[node] = a if a > b else b
            node //= 2
