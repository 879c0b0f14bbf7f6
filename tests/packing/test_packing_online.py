"""OnlinePacker: exact groups on hand-computed streams, coverage, budgets, bounds and exact resume."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_pack.packing import OnlinePacker, OversizeError, PackingStats
from energon_pack.packing.online import TYPICAL_AFTER


def run(packer, stream):
    out = []
    for key, cost in stream:
        out.append(packer.push(key, cost))
    return out


def test_golden_stream_with_carry_over():
    # capacity 10, at most 3 held. Worked by hand (best fit = tightest open bin that fits):
    # a6 -> b0 | b5 -> b1 | c4 -> b0 full -> [a,c] | d3 -> b1 (room 2) | e7 -> b2 (room 3)
    # f2 -> b1 full -> [b,d,f] | g9 -> b3 (room 1) | h1 -> b3 full -> [g,h] | i2 -> b2 (room 1)
    # j5 -> b4 | k5 -> b4 full -> [j,k] | flush -> [e,i]
    p = OnlinePacker(10, max_buffered=3)
    stream = list(zip("abcdefghijk", [6, 5, 4, 3, 7, 2, 9, 1, 2, 5, 5]))
    assert run(p, stream) == [[], [], [["a", "c"]], [], [], [["b", "d", "f"]], [], [["g", "h"]], [], [], [["j", "k"]]]
    assert p.held == 2 and p.held_tokens == 9
    assert p.flush() == [["e", "i"]]
    assert p.held == 0 and p.open_bins == 0
    s = p.stats
    assert (s.packs, s.samples, s.real_tokens, s.slots) == (5, 11, 49, 50)
    assert dict(s.samples_per_pack) == {2: 4, 3: 1}
    assert s.fill_histogram[19] == 4 and s.fill_histogram[18] == 1  # four full packs, one at 90%


def test_sample_bound_emits_fullest_bin_first():
    p = OnlinePacker(10, max_buffered=2)
    assert p.push("a", 6) == [] and p.push("b", 5) == []
    assert p.push("c", 8) == [["c"]]  # 3 held > 2; rooms a:4 b:5 c:2 -> c is the fullest
    assert p.push("d", 9) == [["d"]]
    assert sorted(p.flush()) == [["a"], ["b"]]


def test_flush_order_is_seeded_and_deterministic():
    def flushed(seed):
        p = OnlinePacker(10, max_buffered=50, seed=seed)
        for i in range(8):
            p.push(i, 6)  # eight bins of one item each
        return p.flush()

    assert flushed(1) == flushed(1)
    assert sorted(flushed(1)) == [[i] for i in range(8)]
    assert flushed(1) != flushed(2)


def test_token_lookahead_bound():
    p = OnlinePacker(10, lookahead_packs=1.5)  # at most 15 tokens held
    assert p.push("a", 6) == [] and p.push("b", 7) == []
    # c fits neither bin (rooms 4 and 3): a third bin, 18 tokens held > 15, the fullest (b) leaves
    assert p.push("c", 5) == [["b"]]
    assert p.held_tokens == 11


def test_min_fill_and_max_age():
    p = OnlinePacker(100, max_buffered=50, min_fill=0.8)
    assert p.push(1, 50) == [] and p.push(2, 30) == [[1, 2]]
    p = OnlinePacker(100, max_buffered=50, max_age=3)
    assert p.push(1, 10) == [] and p.push(2, 95) == [] and p.push(3, 95) == []
    # the bin of 1 opened at push 1; at push 4 it has been open for 3 pushes
    assert p.push(4, 96) == [[1]]


def test_dead_bins_leave_once_typical_costs_are_known():
    p = OnlinePacker(1000, max_buffered=1000)
    for i in range(TYPICAL_AFTER):
        assert p.push(i, 10) == []  # one open bin of 320 tokens
    # room 5 is below the smallest cost seen (10): nothing can fit any more, the bin leaves
    assert p.push("big", 675) == [list(range(TYPICAL_AFTER)) + ["big"]]
    p = OnlinePacker(1000, max_buffered=1000)
    for i in range(TYPICAL_AFTER - 2):
        p.push(i, 10)
    # only 31 items seen: the smallest cost is not trusted yet, room 5 keeps the bin open
    assert p.push("big", 695) == []
    assert p.push("y", 10) == [] and p.open_bins == 2


def test_multi_budget_respected():
    p = OnlinePacker((100, 2), max_buffered=10)
    p.push("img1", (10, 1))
    p.push("img2", (10, 1))
    p.push("img3", (10, 1))  # media budget full in the first bin -> a second bin
    assert p.open_bins == 2
    groups = p.flush()
    assert sorted(map(sorted, groups)) == [["img1", "img2"], ["img3"]]


def test_oversize_skip_and_error():
    p = OnlinePacker((10, 1), max_buffered=4)
    assert p.push("ok", (5, 1)) == []
    assert p.push("long", (11, 0)) == [] and p.push("media", (1, 2)) == []
    assert p.pop_skipped() == [("long", "oversize"), ("media", "oversize")]
    assert p.pop_skipped() == []
    assert p.stats.skips == {"oversize": 2}
    with pytest.raises(OversizeError, match="exceeds capacity"):
        OnlinePacker(10, on_oversize="error").push("x", 11)


@pytest.mark.parametrize(
    "cost, match", [(-1, "negative"), (float("nan"), "NaN"), ((1, 2), "budgets"), ("7", "integers")]
)
def test_bad_costs(cost, match):
    with pytest.raises(ValueError, match=match):
        OnlinePacker(10).push("k", cost)


def test_duplicate_key_and_bad_config():
    p = OnlinePacker(10)
    p.push("k", 1)
    with pytest.raises(ValueError, match="duplicate key 'k'"):
        p.push("k", 2)
    for kw, match in [
        (dict(max_buffered=0), "max_buffered"),
        (dict(lookahead_packs=0), "lookahead_packs"),
        (dict(min_fill=1.5), "min_fill"),
        (dict(max_age=0), "max_age"),
        (dict(on_oversize="drop"), "on_oversize"),
    ]:
        with pytest.raises(ValueError, match=match):
            OnlinePacker(10, **kw)


def test_restore_rejects_other_capacity():
    state = OnlinePacker(10).state_dict()
    with pytest.raises(ValueError, match="same width"):
        OnlinePacker(12).load_state_dict(state)


def test_stats_merge():
    a, b = PackingStats(), PackingStats()
    a.record_pack([(3,), (4,)], (10,))
    b.record_pack([(10,)], (10,))
    b.record_skip("oversize")
    m = a.merge(b)
    assert (m.packs, m.samples, m.real_tokens, m.slots, m.fill) == (2, 3, 17, 20, 0.85)
    assert m.skips == {"oversize": 1} and dict(m.samples_per_pack) == {2: 1, 1: 1}
    assert PackingStats.from_state_dict(json.loads(json.dumps(m.state_dict()))) == m


config_strategy = st.fixed_dictionaries(
    {
        "max_buffered": st.one_of(st.none(), st.integers(1, 12)),
        "lookahead_packs": st.one_of(st.none(), st.floats(0.5, 4)),
        "min_fill": st.one_of(st.none(), st.floats(0.5, 1.0)),
        "max_age": st.one_of(st.none(), st.integers(1, 20)),
        "seed": st.integers(0, 3),
    }
)
stream_strategy = st.integers(1, 2).flatmap(
    lambda d: st.tuples(
        st.tuples(*[st.integers(4, 20)] * d),
        st.lists(st.tuples(*[st.integers(0, 24)] * d), max_size=120),
    )
)


@settings(max_examples=120, deadline=None)
@given(config_strategy, stream_strategy, st.integers(0, 120))
def test_coverage_budgets_bounds_and_exact_resume(config, stream, cut):
    capacity, costs = stream
    keys = list(range(len(costs)))
    p = OnlinePacker(capacity, **config)
    groups, skipped = [], []
    state = None
    for k, c in zip(keys, costs):
        if k == cut:
            state = json.loads(json.dumps(p.state_dict()))  # plain data only
            restored = OnlinePacker(capacity, **config)
            restored.load_state_dict(state)
            tail = [(kk, cc) for kk, cc in zip(keys[k:], costs[k:])]
        out = p.push(k, c)
        groups += out
        skipped += p.pop_skipped()
        if config["max_buffered"] is not None:
            assert p.held <= config["max_buffered"]
        if config["lookahead_packs"] is not None:
            assert p.held_tokens <= int(config["lookahead_packs"] * capacity[0])
    final = p.flush()
    groups += final
    assert p.held == 0
    # every key leaves exactly once: in one group or as one skip
    left = sorted([k for g in groups for k in g] + [k for k, _ in skipped])
    assert left == keys
    for g in groups:
        assert g
        for d in range(len(capacity)):
            assert sum(costs[k][d] for k in g) <= capacity[d]
    for k, reason in skipped:
        assert reason == "oversize" and any(c > cap for c, cap in zip(costs[k], capacity))
    if state is not None:
        # the restored packer yields exactly the same future groups as the original did
        expected = []
        reference = OnlinePacker(capacity, **config)
        for k, c in zip(keys[:cut], costs[:cut]):
            reference.push(k, c)
        for k, c in tail:
            expected.append(reference.push(k, c))
        expected.append(reference.flush())
        got = [restored.push(k, c) for k, c in tail] + [restored.flush()]
        assert got == expected
        assert restored.stats == reference.stats


def test_restore_mid_stream_real_mix_identical():
    import numpy as np

    rng = np.random.default_rng(3)
    costs = [(int(t), int(m)) for t, m in zip(rng.lognormal(6, 0.7, 3000).clip(1, 4000), rng.integers(0, 2, 3000))]
    cfg = dict(max_buffered=48, max_age=400, seed=5)
    a = OnlinePacker((4096, 6), **cfg)
    for i in range(1700):
        a.push(i, costs[i])
    b = OnlinePacker((4096, 6), **cfg)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    out_a = [a.push(i, costs[i]) for i in range(1700, 3000)] + [a.flush()]
    out_b = [b.push(i, costs[i]) for i in range(1700, 3000)] + [b.flush()]
    assert out_a == out_b and sum(map(len, out_a)) > 50
