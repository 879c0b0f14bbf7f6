"""First-/best-fit-decreasing over multi-budget costs: exact groups and equality with naive O(n^2) versions."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.packing import (
    OversizeError,
    best_fit_decreasing,
    decreasing_order,
    first_fit_decreasing,
)


def naive_first_fit(costs, capacity, order):
    rooms, groups = [], []
    for i in order:
        for b, room in enumerate(rooms):  # noqa: B007 (b is the bin after the loop)
            if all(c <= r for c, r in zip(costs[i], room)):
                break
        else:
            b = len(rooms)
            rooms.append(list(capacity))
            groups.append([])
        rooms[b] = [r - c for r, c in zip(rooms[b], costs[i])]
        groups[b].append(i)
    return groups


def naive_best_fit(costs, capacity, order):
    rooms, groups = [], []
    for i in order:
        best = None
        for b, room in enumerate(rooms):
            if all(c <= r for c, r in zip(costs[i], room)) and (best is None or room[0] < rooms[best][0]):
                best = b
        if best is None:
            best = len(rooms)
            rooms.append(list(capacity))
            groups.append([])
        rooms[best] = [r - c for r, c in zip(rooms[best], costs[i])]
        groups[best].append(i)
    return groups


def test_ffd_golden_single_budget():
    # sorted: 6(0) 5(1) 4(2) 3(3) 2(4); 6->b0, 5->b1, 4->b0 (room 4), 3->b1, 2->b1
    assert first_fit_decreasing([6, 5, 4, 3, 2], 10).groups == [[0, 2], [1, 3, 4]]
    # stable for equal sizes, input order kept
    assert first_fit_decreasing([3, 3, 3, 3], 6).groups == [[0, 1], [2, 3]]


def test_multi_budget_golden():
    # capacity (10 tokens, 1 image); items (tokens, images); shares 0=1.5 2=1.4 1=.4 3=.3 -> order 0,2,1,3
    # 0 -> b0 (room 5,0); 2 needs an image -> b1 (room 6,0); 1 -> b0 in both (FF: first; BF: room 5 < 6); 3 -> b1
    costs = [(5, 1), (4, 0), (4, 1), (3, 0)]
    assert first_fit_decreasing(costs, (10, 1)).groups == [[0, 1], [2, 3]]
    assert best_fit_decreasing(costs, (10, 1)).groups == [[0, 1], [2, 3]]


def test_first_and_best_fit_choose_different_bins():
    # (tokens, images) capacity (10, 2). Order by share: 0:(3,1)=.8, 1:(8,0)=.8 stable -> 0,1 ; 2:(2,0)
    # 0 -> b0 (room 7,1); 1 -> b1 (room 2,2); 2 -> FF b0 ; BF b1 (room 2 is tighter)
    costs = [(3, 1), (8, 0), (2, 0)]
    assert first_fit_decreasing(costs, (10, 2)).groups == [[0, 2], [1]]
    assert best_fit_decreasing(costs, (10, 2)).groups == [[0], [1, 2]]


def test_oversize_policies():
    with pytest.raises(OversizeError, match="on_oversize='skip'"):
        first_fit_decreasing([3, 11, 2], 10)
    r = first_fit_decreasing([3, 11, 2, (12)], 10, on_oversize="skip")
    assert r.groups == [[0, 2]] and r.skipped == [1, 3]
    r = best_fit_decreasing([(3, 0), (2, 5)], (10, 1), on_oversize="skip")
    assert r.groups == [[0]] and r.skipped == [1]


@pytest.mark.parametrize(
    "costs, match",
    [
        ([1, -2], "non-negative"),
        ([1.0, float("nan")], "NaN"),
        ([1.5], "whole"),
        ([[1, 2]], "shape"),
        (["a"], "integers"),
    ],
)
def test_bad_costs_raise(costs, match):
    with pytest.raises(ValueError, match=match):
        first_fit_decreasing(costs, 10)


def test_bad_capacity_raises():
    with pytest.raises(ValueError, match="positive"):
        best_fit_decreasing([1], 0)
    with pytest.raises(ValueError, match="NaN"):
        best_fit_decreasing([1], float("nan"))


def test_empty_input():
    assert first_fit_decreasing([], 8).groups == [] and best_fit_decreasing([], (8, 1)).groups == []


costs_strategy = st.integers(1, 3).flatmap(
    lambda d: st.tuples(
        st.just(d),
        st.lists(st.tuples(*[st.integers(0, 12)] * d), min_size=0, max_size=60),
        st.tuples(*[st.integers(1, 12)] * d),
    )
)


@settings(max_examples=150, deadline=None)
@given(costs_strategy)
def test_matches_naive_and_respects_budgets(case):
    d, costs, capacity = case
    arr = np.array(costs, dtype=np.int64).reshape(len(costs), d)
    fits = [i for i in range(len(costs)) if all(c <= cap for c, cap in zip(costs[i], capacity))]
    order = [int(i) for i in decreasing_order(arr, capacity) if int(i) in set(fits)]
    for fn, naive in ((first_fit_decreasing, naive_first_fit), (best_fit_decreasing, naive_best_fit)):
        r = fn(arr, capacity, on_oversize="skip")
        assert sorted(r.skipped) == sorted(set(range(len(costs))) - set(fits))
        assert sorted(i for g in r.groups for i in g) == sorted(fits)
        for g in r.groups:
            for b in range(d):
                assert sum(costs[i][b] for i in g) <= capacity[b]
        assert r.groups == naive(costs, capacity, order)


def test_large_input_is_fast_and_full():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(math.log(350), 0.63, 20000).round(), 1, 8192).astype(np.int64)
    for fn in (first_fit_decreasing, best_fit_decreasing):
        r = fn(lengths, 8192)
        assert sum(len(g) for g in r.groups) == len(lengths)
        assert lengths.sum() / (len(r.groups) * 8192) > 0.995
