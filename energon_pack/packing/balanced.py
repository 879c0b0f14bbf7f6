"""Packs full in tokens *and* equal in step cost: the compute-balanced streaming packer.

Packs with equal tokens cost unequal GPU time (attention per segment squared, vision patches:
:mod:`.step_cost`), and a data-parallel step waits for its slowest rank. Capping the cost as a
second budget of :class:`~energon_pack.packing.online.OnlinePacker` trades fill for balance (a bin
closes on whichever budget fills first). This packer chooses combinations for both at once.

It holds up to ``buffer_size`` samples. Each sample has an *excess* ``e = cost - rho * tokens``:
its cost above what its tokens cost at the stream's mean cost per token ``rho`` (a running mean
of what was pushed). A full pack whose excesses sum to zero costs exactly the mean full pack,
``rho * width``. When the buffer is full one pack is built: it starts with the oldest sample
(every sample leaves within a bounded delay), then adds, one at a time, the sample that minimises

    max(0, |E + e| - slack * rho * room_after) / (rho * width)  +  room_weight * room_after / width

among those that fit, where ``E`` is the pack's excess so far and ``room_after`` the tokens left
after adding it: a deviation is tolerated while much room is left to correct it and must vanish
as the pack fills; the second term keeps packs full. When nothing fits, a *polish* pass (up to
``polish_moves`` moves) swaps one member (never the oldest) for a held sample, adds one or drops one,
each time the move that most lowers the pack's final score

    deviation_weight * ((cost - rho * width) / (rho * width))^2  +  room / width

an estimate of the throughput the pack loses: an empty token is a lost token, and a data-parallel step loses
about ``c_N * cv`` to its slowest rank (``c_N`` the expected largest of N standard normals, 1.42 for N=8), whose
share of one pack's squared deviation is ``c_N / (2 cv)``: 25 at the bench mix's cv of about 3% (the default;
not fitted). Being quadratic, it trims outliers and leaves small deviations, which cost little. The greedy
pass alone leaves packs its last pick could not correct, and packs around a very heavy oldest sample (a
high-resolution image, several photos) far above the mean; the polish evens the first and trims the second,
leaving some room where a full pack would make every rank wait.

Tuned on the bench mixes only (:mod:`energon_pack.bench.mixes`: ``llava_photos``, ``hires_mix``) and checked on
data it was never tuned on: public third-party mixes converted with ``energon-pack convert`` (public mix,
``scripts/public_mix.py``, photos and video, 3,946 records each), read through the real Qwen2.5-VL encoder and
tokenizer, ``cost_model="qwen2.5-vl-3b"``, width 8192, K=64, every pack priced by an independent Qwen2.5-VL-3B
FLOP count (``python -m energon_pack.bench.balance_bench --data ...``, ``docs/benchmarks/balance_public.json``).
Predicted DP-8 efficiency, photos: 0.942 without the polish, 0.972 with it, at 99.56% fill (tokens only: 0.847 at
99.82%); video: 0.957, 0.974 at 99.54% (tokens only: 0.889 at 99.81%). The polish takes 1.2-1.7x the greedy
pass's time in the runs measured (well under 1 ms a sample at K=256). The state is plain data and a restored
packer builds exactly the same future packs.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from .costs import CostLike, as_capacity, as_cost
from .online import check_oversize_policy, over_capacity
from .stats import PackingStats

#: 2: the polish pass and its knobs (a format-1 state, saved before it, resumes with ``polish_moves=0``: its packs)
STATE_FORMAT = 2
OVERSIZE_REASON = "oversize"
#: excess tolerated per token of room left, as a share of the mean cost per token
DEFAULT_SLACK = 0.03
#: weight of the tokens left empty against the cost deviation in the greedy pass (both as shares of a full pack)
DEFAULT_ROOM_WEIGHT = 0.2
DEFAULT_BUFFER_SIZE = 256
#: moves of the polish pass per pack (0: the greedy pass alone, as in state format 1)
DEFAULT_POLISH_MOVES = 4
#: the polish's weight of a pack's squared relative cost deviation against its share of empty tokens (module doc:
#: c_8 / (2 cv) = 1.42 / 0.06 ~ 25; on the bench mixes 10 keeps more fill and balances less, 100 the opposite)
DEFAULT_DEVIATION_WEIGHT = 25.0
#: the knobs a state records, each compared on resume (or taken from it with ``resume_saved_tuning``)
TUNING = ("slack", "room_weight", "polish_moves", "deviation_weight")
#: a format-1 state's polish: none
FORMAT_1_POLISH = {"polish_moves": 0, "deviation_weight": DEFAULT_DEVIATION_WEIGHT}
#: what a packer makes equal across packs: tokens only, or tokens and step cost (the ``balance`` knob)
BALANCE_MODES = ("tokens", "compute")


class ComputeBalancedPacker:
    """Streaming packer of samples into packs of ``capacity`` (tokens first, then any other budgets, as for
    :class:`~energon_pack.packing.online.OnlinePacker`) whose step costs are about equal.

    Args:
        capacity: the budgets of one pack: an int (tokens, ``seq_length``) or a vector (tokens first, then e.g.
            vision patches, media items, segments); every budget is respected.
        buffer_size: samples held; a pack is built each time it is full. More choices balance better on the bench
            mix (DP-8: 0.985 at 64, 0.990 at 256), not always on others (public photo mix: 0.972, 0.966), at the
            cost of memory and latency.
        slack: the excess tolerated per token of room left, as a share of the mean cost per token.
        room_weight: how much an empty token weighs against the cost deviation in the greedy pass.
        polish_moves: the most moves of the polish pass per pack (0: the greedy pass alone).
        deviation_weight: the polish's weight of the squared relative cost deviation against the empty share.
        on_oversize: a sample over the capacity in some budget: ``"skip"`` (counted, :meth:`pop_skipped`) or
            ``"error"`` (:class:`~energon_pack.packing.offline.OversizeError`), as for
            :class:`~energon_pack.packing.online.OnlinePacker`.
        resume_saved_tuning: on :meth:`load_state_dict`, take ``slack``, ``room_weight`` and the polish knobs from
            the saved state instead of refusing a state saved with others. For callers that do not expose them
            (the encoders: a run saved under an earlier release's defaults, a format-1 state among them, then
            continues with the packs it would have built); the budgets and the buffer must still match.
    """

    def __init__(
        self,
        capacity: CostLike,
        *,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        slack: float = DEFAULT_SLACK,
        room_weight: float = DEFAULT_ROOM_WEIGHT,
        polish_moves: int = DEFAULT_POLISH_MOVES,
        deviation_weight: float = DEFAULT_DEVIATION_WEIGHT,
        on_oversize: str = "skip",
        resume_saved_tuning: bool = False,
    ) -> None:
        self.capacity = as_capacity(capacity)
        width = self.capacity[0]
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int (samples held), got {buffer_size!r}")
        for name, value in (("slack", slack), ("room_weight", room_weight), ("deviation_weight", deviation_weight)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(polish_moves, bool) or not isinstance(polish_moves, int) or polish_moves < 0:
            raise ValueError(f"polish_moves must be an int >= 0 (moves per pack), got {polish_moves!r}")
        check_oversize_policy(on_oversize)
        self.on_oversize = on_oversize
        self.width, self.buffer_size = width, buffer_size
        self.slack, self.room_weight = float(slack), float(room_weight)
        self.polish_moves, self.deviation_weight = polish_moves, float(deviation_weight)
        self.resume_saved_tuning = bool(resume_saved_tuning)
        self._reset()

    def _reset(self) -> None:
        self._keys: list[Hashable] = []
        self._budgets: list[tuple[int, ...]] = []  # every budget, tokens first
        self._costs: list[float] = []
        self._sum_tokens = 0
        self._sum_cost = 0.0
        self._skipped: list[tuple[Hashable, str]] = []
        self.stats = PackingStats()
        self.cost_packed = 0.0  # summed cost of the emitted packs

    @property
    def held(self) -> int:
        return len(self._keys)

    @property
    def cost_per_token(self) -> float:
        """The running mean cost per token of what was pushed (1.0 before the first sample)."""
        return self._sum_cost / self._sum_tokens if self._sum_tokens else 1.0

    def held_keys(self) -> list[Hashable]:
        """The keys held (not yet in an emitted pack), oldest first."""
        return list(self._keys)

    def push(self, key: Hashable, budgets: CostLike, cost: float) -> list[list[Hashable]]:
        """Add one sample: its ``budgets`` (tokens, or a vector in the order of ``capacity``) and its step
        ``cost``; returns the packs (lists of keys) ready now."""
        budgets = as_cost(budgets, len(self.capacity), key=key)
        cost = float(cost)
        if not np.isfinite(cost) or cost < 0:
            raise ValueError(f"cost of {key!r} must be a finite number >= 0, got {cost!r}")
        if key in self._keys:
            raise ValueError(f"duplicate key {key!r}: it is already held by the packer")
        if over_capacity(key, budgets, self.capacity, self.on_oversize):
            self._skipped.append((key, OVERSIZE_REASON))
            self.stats.record_skip(OVERSIZE_REASON)
            return []
        self._keys.append(key)
        self._budgets.append(budgets)
        self._costs.append(cost)
        self._sum_tokens += budgets[0]
        self._sum_cost += cost
        return [self._build()] if len(self._keys) >= self.buffer_size else []

    def flush(self) -> list[list[Hashable]]:
        """Build packs of everything held (end of a finite stream); the packer is then empty."""
        out = []
        while self._keys:
            out.append(self._build())
        return out

    def pop_skipped(self) -> list[tuple[Hashable, str]]:
        out, self._skipped = self._skipped, []
        return out

    def _build(self) -> list[Hashable]:
        """One pack from the buffer: the oldest sample, then the best-scoring fitting one until none fits, then
        the polish pass."""
        budgets = np.asarray(self._budgets, dtype=np.int64).reshape(len(self._budgets), len(self.capacity))
        tokens, capacity = budgets[:, 0], np.asarray(self.capacity, dtype=np.int64)
        costs = np.asarray(self._costs, dtype=np.float64)
        rho = self.cost_per_token
        excess = costs - rho * tokens
        full_cost = rho * self.width
        taken = np.zeros(len(tokens), dtype=bool)
        taken[0] = True
        used, pack_excess = budgets[0].copy(), float(excess[0])
        order = [0]
        while True:
            room = self.width - int(used[0])
            fits = ~taken & (budgets + used <= capacity).all(axis=1)
            if not fits.any():
                break
            after = room - tokens
            deviation = np.maximum(0.0, np.abs(pack_excess + excess) - self.slack * rho * after) / full_cost
            score = np.where(fits, deviation + self.room_weight * after / self.width, np.inf)
            pick = int(np.argmin(score))  # ties: the oldest
            taken[pick] = True
            order.append(pick)
            used += budgets[pick]
            pack_excess += float(excess[pick])
        for _ in range(self.polish_moves):
            move = self._best_move(order, taken, used, float(costs[order].sum()), budgets, costs, full_cost)
            if move is None:
                break
            out, into = move
            if out is not None:
                taken[out] = False
                order.remove(out)
                used -= budgets[out]
            if into is not None:
                taken[into] = True
                order.append(into)
                used += budgets[into]
        group = [self._keys[i] for i in order]
        self.stats.record_pack([self._budgets[i] for i in order], self.capacity)
        self.cost_packed += float(costs[order].sum())
        keep = [i for i in range(len(tokens)) if not taken[i]]
        self._keys = [self._keys[i] for i in keep]
        self._budgets = [self._budgets[i] for i in keep]
        self._costs = [self._costs[i] for i in keep]
        return group

    def _score(self, cost: np.ndarray, room: np.ndarray, full_cost: float) -> np.ndarray:
        """The polish's score of finished packs (module doc): the weighted squared relative cost deviation from the
        mean full pack plus the share of empty tokens."""
        return self.deviation_weight * ((cost - full_cost) / full_cost) ** 2 + room / self.width

    def _best_move(
        self,
        order: list[int],
        taken: np.ndarray,
        used: np.ndarray,
        cost: float,
        budgets: np.ndarray,
        costs: np.ndarray,
        full_cost: float,
    ) -> tuple[int | None, int | None] | None:
        """The (member out, held sample in) move (either may be None: add one, drop one) that most lowers
        :meth:`_score` within every budget, or None if none lowers it. The oldest (``order[0]``) stays; ties go to
        the earliest member, then the oldest held sample."""
        room, capacity = self.width - int(used[0]), np.asarray(self.capacity, dtype=np.int64)
        members = np.asarray(order[1:], dtype=np.int64)
        held = np.flatnonzero(~taken)
        # rows: no member out, then each member out; columns: no sample in, then each held sample in
        out_budgets = np.vstack([np.zeros((1, budgets.shape[1]), np.int64), budgets[members]])
        in_budgets = np.vstack([np.zeros((1, budgets.shape[1]), np.int64), budgets[held]])
        out_costs, in_costs = np.concatenate([[0.0], costs[members]]), np.concatenate([[0.0], costs[held]])
        fits = ((used - out_budgets)[:, None, :] + in_budgets[None, :, :] <= capacity).all(axis=2)
        after_cost = cost - out_costs[:, None] + in_costs[None, :]
        after_room = room + out_budgets[:, None, 0] - in_budgets[None, :, 0]
        score = np.where(fits, self._score(after_cost, after_room, full_cost), np.inf)
        score[0, 0] = np.inf  # no move
        best = int(np.argmin(score))
        row, col = divmod(best, score.shape[1])
        if not score[row, col] < self._score(np.asarray(cost), np.asarray(room), full_cost):
            return None
        return (int(members[row - 1]) if row else None, int(held[col - 1]) if col else None)

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: restoring it reproduces the same future packs exactly."""
        return {
            "format": STATE_FORMAT,
            "capacity": list(self.capacity),
            "buffer_size": self.buffer_size,
            **{k: getattr(self, k) for k in TUNING},
            "held": [[k, list(b), c] for k, b, c in zip(self._keys, self._budgets, self._costs)],
            "sum_tokens": self._sum_tokens,
            "sum_cost": self._sum_cost,
            "cost_packed": self.cost_packed,
            "stats": self.stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a format-1 state (saved before the polish pass) is read as ``polish_moves=0``,
        so a packer that resumes saved tuning continues it with the packs it would have built."""
        if state.get("format") == 1:
            state = {**FORMAT_1_POLISH, **state, "format": STATE_FORMAT}
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported packer state format {state.get('format')!r}")
        knobs = ("capacity", "buffer_size") + (() if self.resume_saved_tuning else TUNING)
        mine = {k: getattr(self, k) for k in knobs}
        mine["capacity"] = list(self.capacity)
        if {k: state[k] for k in knobs} != mine:
            raise ValueError(
                f"packer state was saved with { ({k: state[k] for k in knobs}) }, this packer has {mine}: "
                "exact resume needs the same budgets, buffer and balance knobs (a packer built with "
                "resume_saved_tuning=True takes the balance knobs from the state)"
            )
        if self.resume_saved_tuning:
            self.slack, self.room_weight = float(state["slack"]), float(state["room_weight"])
            self.polish_moves, self.deviation_weight = int(state["polish_moves"]), float(state["deviation_weight"])
        self._reset()
        for key, budgets, cost in state["held"]:
            self._keys.append(tuple(key) if isinstance(key, list) else key)
            self._budgets.append(tuple(int(b) for b in budgets))
            self._costs.append(float(cost))
        self._sum_tokens, self._sum_cost = int(state["sum_tokens"]), float(state["sum_cost"])
        self.cost_packed = float(state["cost_packed"])
        self.stats = PackingStats.from_state_dict(state["stats"])
