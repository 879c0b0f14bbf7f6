"""TokenBudgetBatchSampler: coverage per epoch across ranks, equal steps, determinism, exact resume."""

import random
from collections import Counter

import numpy as np
import pytest

from energon_pack.errors import ConfigError
from energon_pack.sft.dataset import PADDING_INDEX
from energon_pack.sft.sampler import TokenBudgetBatchSampler
from energon_pack.thd import aligned_length

SEQ_LENGTH = 256


def make_lengths(n=600, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(40), 0.7, n).round().clip(2, 300).astype(np.int64)
    lengths[rng.random(n) < 0.05] = -1  # unusable lines from the length pass
    return lengths


def rank_batches(lengths, world, epoch=0, **kw):
    out = []
    for rank in range(world):
        s = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, num_replicas=world, rank=rank, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("cp, pad_multiple", [(1, 1), (4, 8)])
def test_every_usable_line_exactly_once_per_epoch_and_equal_steps(world, cp, pad_multiple):
    lengths = make_lengths()
    per_rank = rank_batches(lengths, world, cp=cp, window=128)
    assert len({len(b) for b in per_rank}) == 1  # all ranks run the same number of steps
    seen = Counter(i for batches in per_rank for mb in batches for i in mb if i != PADDING_INDEX)
    fits = (lengths > 0) & (aligned_length(lengths, pad_multiple) <= SEQ_LENGTH)
    assert sorted(seen) == np.flatnonzero(fits).tolist() and set(seen.values()) == {1}
    for batches in per_rank:
        for mb in batches:
            if mb == [PADDING_INDEX]:
                continue
            assert PADDING_INDEX not in mb and aligned_length(lengths[mb], pad_multiple).sum() <= SEQ_LENGTH
    padding = sum(mb == [PADDING_INDEX] for batches in per_rank for mb in batches)
    plan = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, cp=cp, window=128).plan()
    assert padding == -len(plan) % world  # only the last step is padded, on the ranks that ran out
    s = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, cp=cp, window=128)
    assert s.pad_multiple == pad_multiple and s.stats.skips.get("oversize", 0) == int(((lengths > 0) & ~fits).sum())


def test_padding_steps_counted_on_the_short_ranks():
    lengths = np.array([200] * 5)  # 5 packs of one sample over 4 ranks: 2 steps each, 3 padding micro-batches
    per_rank = rank_batches(lengths, 4)
    assert [len(b) for b in per_rank] == [2, 2, 2, 2]
    assert [b[1] for b in per_rank].count([PADDING_INDEX]) == 3
    steps = [TokenBudgetBatchSampler(lengths, SEQ_LENGTH, num_replicas=4, rank=r).padding_steps for r in range(4)]
    assert steps == [0, 1, 1, 1]


def test_deterministic_per_seed_and_epoch_and_high_fill():
    lengths = make_lengths(2000)
    a, b = rank_batches(lengths, 2, epoch=3, seed=7), rank_batches(lengths, 2, epoch=3, seed=7)
    assert a == b
    assert rank_batches(lengths, 2, epoch=4, seed=7) != a and rank_batches(lengths, 2, epoch=3, seed=8) != a
    s = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, window=1024)
    assert s.stats.fill > 0.97 and s.stats.samples + s.stats.skipped == len(lengths)  # skips: unusable + oversize


def test_max_segments_and_unshuffled_order():
    lengths = np.full(50, 10)
    plan = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, max_segments=4, shuffle=False).plan()
    assert [len(mb) for mb in plan] == [4] * 12 + [2] and plan[0] == [0, 1, 2, 3]


def test_resume_at_random_points_reproduces_the_rest_of_the_epoch():
    lengths = make_lengths()
    rng = random.Random(0)
    for world in (1, 2, 4):
        for rank in range(world):
            full = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, num_replicas=world, rank=rank, seed=3)
            full.set_epoch(2)
            expected = list(full)
            for _ in range(3):
                step = rng.randrange(len(expected) + 1)
                first = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, num_replicas=world, rank=rank, seed=3)
                first.set_epoch(2)
                it = iter(first)
                head = [next(it) for _ in range(step)]
                state = first.state_dict()
                assert state["epoch"] == 2 and state["step"] == step
                resumed = TokenBudgetBatchSampler(lengths, SEQ_LENGTH, num_replicas=world, rank=rank, seed=3)
                resumed.load_state_dict(state)
                assert head + list(resumed) == expected
                assert list(resumed) == expected  # the following pass starts the epoch over


def test_state_dict_with_explicit_steps_and_mismatched_config():
    lengths = make_lengths()
    s = TokenBudgetBatchSampler(lengths, SEQ_LENGTH)
    list(s)  # a prefetching loader ran ahead; the trainer consumed 5 steps
    state = s.state_dict(steps_consumed=5)
    resumed = TokenBudgetBatchSampler(lengths, SEQ_LENGTH)
    resumed.load_state_dict(state)
    assert list(resumed) == s.plan()[5:]
    with pytest.raises(ValueError, match="width"):
        TokenBudgetBatchSampler(lengths, 512).load_state_dict(state)
    with pytest.raises(ValueError, match="lengths"):
        TokenBudgetBatchSampler(lengths[:-1], SEQ_LENGTH).load_state_dict(state)


def test_config_errors_name_the_knob():
    with pytest.raises(
        ConfigError,
        match=r"^seq_length: 100 is not divisible by the alignment 8 of cp=4\. Fix: use a multiple of 8",
    ):
        TokenBudgetBatchSampler([5], 100, cp=4)
    with pytest.raises(ConfigError, match="rank"):
        TokenBudgetBatchSampler([5], 128, num_replicas=2, rank=2)


def test_old_name_width_still_works_and_warns():
    lengths = make_lengths()
    with pytest.warns(DeprecationWarning, match="TokenBudgetBatchSampler: 'width' is deprecated, use 'seq_length'"):
        old = TokenBudgetBatchSampler(lengths, width=SEQ_LENGTH, cp=2)
    new = TokenBudgetBatchSampler(lengths, seq_length=SEQ_LENGTH, cp=2)
    assert old.seq_length == SEQ_LENGTH and old.plan() == new.plan()
    with pytest.warns(DeprecationWarning, match=r"TokenBudgetBatchSampler\.width: 'width' is deprecated"):
        assert new.width == SEQ_LENGTH
    assert new.state_dict()["config"]["width"] == SEQ_LENGTH  # the saved key is unchanged: old checkpoints still load


def test_compute_balance_equalises_the_attention_cost_of_long_documents():
    """Long documents cost more than their tokens (attention per segment squared): balanced micro-batches
    spread less in step cost (full packs; each window's last partial packs aside), every line still once, at the
    same fill; a resume refuses the other mode."""
    from energon_pack.packing.step_cost import StepCostModel

    rng = np.random.default_rng(3)
    lengths = np.where(rng.random(6000) < 0.3, rng.integers(1500, 4000, 6000), rng.integers(50, 900, 6000))
    model = StepCostModel.from_shape("qwen2.5-vl-7b")
    cv, fill, samplers = {}, {}, {}
    for balance in ("tokens", "compute"):
        s = samplers[balance] = TokenBudgetBatchSampler(lengths, 8192, window=2048, balance=balance)
        assert sorted(i for b in s.plan() for i in b) == list(range(len(lengths)))
        tokens = np.asarray([lengths[b].sum() for b in s.plan()])
        cost = np.asarray([sum(model.sample_cost(int(lengths[i])) for i in b) for b in s.plan()])[tokens >= 8028]
        cv[balance], fill[balance] = cost.std() / cost.mean(), s.stats.fill
    assert cv["compute"] < 0.8 * cv["tokens"] and fill["compute"] > fill["tokens"] - 0.001, (cv, fill)
    state = samplers["compute"].state_dict(3)
    assert state["config"]["balance"] == "compute"
    with pytest.raises(ValueError, match="balance"):
        samplers["tokens"].load_state_dict(state)
    with pytest.raises(ConfigError) as caught:
        TokenBudgetBatchSampler(lengths, 8192, balance="flops")
    assert caught.value.knob == "balance"


def test_a_balanced_state_resumes_with_the_packer_tuning_it_was_saved_under():
    """A balanced plan depends on the packer's tuning (slack, room_weight): a state saved under other tuning resumes
    with the plan it was saved under, and one without the key (an earlier release) with that release's 0.15."""
    rng = np.random.default_rng(4)
    lengths = np.where(rng.random(3000) < 0.3, rng.integers(1500, 4000, 3000), rng.integers(50, 900, 3000))
    old = TokenBudgetBatchSampler(lengths, 8192, window=1024, balance="compute")
    old._balance_tuning, old._plan_cache = (0.5, 0.0), None  # another tuning
    new = TokenBudgetBatchSampler(lengths, 8192, window=1024, balance="compute")
    assert old.plan() != new.plan()  # the tuning changes the packs
    state = old.state_dict(7)
    assert state["config"]["balance_tuning"] == [0.5, 0.0]
    new.load_state_dict(state)
    assert list(new) == old.plan()[7:]
    del state["config"]["balance_tuning"]  # as the release before the key wrote it
    fresh = TokenBudgetBatchSampler(lengths, 8192, window=1024, balance="compute")
    fresh.load_state_dict(state)
    assert fresh._balance_tuning == (0.03, 0.15)


def test_the_default_balances_compute_and_follows_a_tokens_state_on_resume():
    """balance left unset packs by compute; a state saved by tokens (every state from before this default: no
    balance key) is continued by tokens, bit for bit; a mode passed explicitly must match, and the error names it."""
    rng = np.random.default_rng(5)
    lengths = np.where(rng.random(3000) < 0.2, rng.integers(1500, 4000, 3000), rng.integers(50, 900, 3000))
    default = TokenBudgetBatchSampler(lengths, 8192, window=1024)
    compute = TokenBudgetBatchSampler(lengths, 8192, window=1024, balance="compute")
    tokens = TokenBudgetBatchSampler(lengths, 8192, window=1024, balance="tokens")
    assert default.balance == "compute" and default.plan() == compute.plan() != tokens.plan()
    state = tokens.state_dict(5)
    assert "balance" not in state["config"]  # what a tokens run has always saved
    default.load_state_dict(state)
    assert default.balance == "tokens" and list(default) == tokens.plan()[5:]
    with pytest.raises(ValueError, match="it was saved with balance='tokens': pass that"):
        compute.load_state_dict(state)
    fresh = TokenBudgetBatchSampler(lengths, 8192, window=1024)
    fresh.load_state_dict(compute.state_dict(2))  # a balanced state into the default: no switch
    assert fresh.balance == "compute" and list(fresh) == compute.plan()[2:]
