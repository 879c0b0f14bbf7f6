"""Multi-budget costs: validation of cost vectors and capacities.

A cost is a vector of non-negative integers, one entry per budget (LLM tokens, vision
patches, media items, ...); a capacity is a vector of positive integers of the same length.
An item fits a bin when every budget fits. Budget 0 is the primary budget (tokens): it drives
best-fit ordering, fill statistics and the token look-ahead bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

Cost = tuple[int, ...]
CostLike = int | Sequence[int] | np.ndarray


def as_capacity(capacity: CostLike) -> Cost:
    """Validate a capacity (an int or a vector of positive ints) and return it as a tuple."""
    values = _as_int_tuple(capacity, what="capacity")
    if not values:
        raise ValueError("capacity must name at least one budget")
    if any(v <= 0 for v in values):
        raise ValueError(f"capacity must be positive in every budget, got {values}")
    return values


def as_cost(cost: CostLike, dims: int, *, key: object = None) -> Cost:
    """Validate one item's cost against the number of budgets and return it as a tuple."""
    # fast paths: a plain int (one budget) or a tuple of plain ints
    if type(cost) is int and dims == 1 and cost >= 0:
        return (cost,)
    if type(cost) is tuple and len(cost) == dims and all(type(c) is int and c >= 0 for c in cost):
        return cost
    values = _as_int_tuple(cost, what=f"cost of item {key!r}")
    if len(values) != dims:
        raise ValueError(f"cost of item {key!r} has {len(values)} budgets, capacity has {dims}")
    if any(v < 0 for v in values):
        raise ValueError(f"cost of item {key!r} is negative: {values}")
    return values


def as_cost_matrix(costs: Sequence[CostLike] | np.ndarray, dims: int) -> np.ndarray:
    """Validate many costs at once; returns an int64 array of shape (n, dims)."""
    arr = np.asarray(costs)
    if arr.size == 0:
        return np.zeros((0, dims), dtype=np.int64)
    if arr.ndim == 1 and dims == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] != dims:
        raise ValueError(f"costs must have shape (n, {dims}), got {arr.shape}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError("costs contain NaN or infinity")
        if not np.all(arr == np.round(arr)):
            raise ValueError("costs must be whole numbers")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"costs must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < 0):
        raise ValueError(f"costs must be non-negative (first bad row {int(np.argmax((arr < 0).any(1)))})")
    return arr


def _as_int_tuple(value: CostLike, *, what: str) -> Cost:
    if isinstance(value, (Integral, Real)) and not isinstance(value, bool):
        value = (value,)
    elif isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist()
    out = []
    for v in value:
        if isinstance(v, bool):
            raise ValueError(f"{what} must be integers, got a bool")
        if isinstance(v, Integral):
            out.append(int(v))
        elif isinstance(v, Real):
            f = float(v)
            if math.isnan(f) or math.isinf(f):
                raise ValueError(f"{what} is NaN or infinite")
            if f != int(f):
                raise ValueError(f"{what} must be whole numbers, got {f}")
            out.append(int(f))
        else:
            raise ValueError(f"{what} must be integers, got {type(v).__name__}")
    return tuple(out)
