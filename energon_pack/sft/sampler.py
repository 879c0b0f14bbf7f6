"""TokenBudgetBatchSampler: micro-batches of dataset indices that each fill one pack of ``seq_length`` tokens.

Per epoch, every rank computes the same global plan: the usable lines (length > 0) in a
permutation seeded by ``(seed, epoch)``, cut into windows of ``window`` samples, each window
packed with :func:`best_fit_decreasing` over aligned lengths (and a segment budget when
``max_segments`` is set), the window's packs in a seeded order. Micro-batch ``j`` of the plan
goes to rank ``j % num_replicas``, so each rank gets whole micro-batches. Ranks short of the
longest rank's step count get ``[PADDING_INDEX]`` micro-batches (one synthetic pad token with no
loss, counted in ``padding_steps``): every rank runs the same number of steps, no real sample is
duplicated. Lines that are unusable (negative length) or wider than the width are never
yielded; the latter are counted in ``stats.skips["oversize"]``, the former under the dataset's
reasons (built from a :class:`JsonlSFTDataset`; ``"unusable"`` from a bare lengths array), so
``stats.samples + stats.skipped`` is the number of lines. When no line can be packed, an empty
run is never silent: :class:`~energon_pack.errors.AllSkippedError` (reasons, counts, an example
line, the likely fix) is raised by the constructor for a dataset, by ``len()`` and ``iter()`` for
a bare lengths array (whose ``plan()`` / ``stats`` still answer, for inspection). ``iter()`` builds
the epoch's plan at once, so a DataLoader's worker processes inherit it instead of each building it.

``state_dict(steps_consumed)`` / ``load_state_dict`` resume mid-epoch exactly: the plan is a
pure function of (lengths, seed, epoch, config), so only the step is stored.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import AllSkippedError, ConfigError, Hint, all_skipped_hints
from ..packing import ComputeBalancedPacker, PackingStats, best_fit_decreasing
from ..packing.balanced import DEFAULT_ROOM_WEIGHT, DEFAULT_SLACK
from ..packing.spec import PackingSpec, accepts_old_names, spec_for
from ..packing.step_cost import cost_model_from, cost_model_name, resolve_cost_model, same_cost_model
from ..thd import aligned_length, warn_old_width
from .dataset import PADDING_INDEX

STATE_FORMAT = 1
OVERSIZE = "oversize"
#: samples the compute-balanced packer holds (at most the window)
BALANCE_BUFFER = 256
#: the PackingSpec knobs the sampler takes as keywords (besides ``seq_length``)
SAMPLER_KNOBS = ("cp", "tp", "sp", "eval_cp", "max_segments", "seed", "balance", "cost_model")
#: (slack, room_weight) of the balanced plans of states saved before their config recorded it
PRE_KEY_BALANCE_TUNING = (0.03, 0.15)


@accepts_old_names
class TokenBudgetBatchSampler:
    """Batch sampler for ``DataLoader(batch_sampler=...)``: each yielded list fills one THD row (module doc).

    The packing knobs are :class:`~energon_pack.packing.spec.PackingSpec`'s (documented there, validated there, one
    ``balance`` default rule); :meth:`from_spec` takes a spec as it is. Old names (``width``, ``pad_multiple``) are
    accepted with one DeprecationWarning naming the new knob (:data:`~energon_pack.packing.spec.OLD_NAMES`).

    Args:
        lengths: a :class:`JsonlSFTDataset` (its ``lengths``, skip reasons and path; an all-skipped dataset
            raises at once) or a 1-D array of token lengths per index (<= 0: unusable).
        seq_length: the pack width (the spec's knob; the collate's :class:`ThdLayout` has the same).
        knobs: the other spec knobs of :data:`SAMPLER_KNOBS` (cp, tp, sp, eval_cp, max_segments, seed, balance,
            cost_model); segments are packed by their length rounded up to the alignment of ``cp``/``tp``/``sp``/
            ``eval_cp`` (:attr:`pad_multiple`), the same as the collate's.
        window: samples packed together per best-fit-decreasing call (default 4096): larger fills better,
            but packs mix samples from further apart in the shuffled order.
        shuffle: seeded permutation (by ``seed``, the epoch mixed in: :meth:`set_epoch`) of the lines and of each
            window's packs (default True).
        num_replicas: data-parallel ranks sharing the plan (default 1).
        rank: this rank, in ``[0, num_replicas)``.

    ``balance="tokens"`` packs each window best-fit-decreasing; ``"compute"`` streams it through
    :class:`~energon_pack.packing.balanced.ComputeBalancedPacker` (its measured fill cost and DP efficiency:
    PackingSpec's ``balance``). With ``balance`` left to its default, :meth:`load_state_dict` of a state saved under the
    other mode continues that run in the state's mode; a mode given explicitly must match the state's. The state records
    the cost model's stable name.
    """

    def __init__(
        self,
        lengths: Any,
        seq_length: int,
        *,
        window: int = 4096,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        **knobs: Any,
    ) -> None:
        self._dataset = lengths if hasattr(lengths, "skipped_lines") else None  # a JsonlSFTDataset or an array
        self.lengths = np.asarray(getattr(lengths, "lengths", lengths), dtype=np.int64)
        if self.lengths.ndim != 1:
            raise ConfigError("lengths", "must be 1-D (one length per dataset index)", "pass dataset.lengths")
        #: the packing knobs (validated once, by the spec; the balance default is its one rule)
        self.spec = spec_for("TokenBudgetBatchSampler", knobs, SAMPLER_KNOBS, seq_length=seq_length)
        for knob, value in (("window", window), ("num_replicas", num_replicas)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(knob, f"must be an int >= 1, got {value!r}", f"set {knob} to a positive integer")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ConfigError("rank", f"must be in [0, {num_replicas}), got {rank!r}", "pass the data-parallel rank")
        self.seq_length, self.max_segments, seed = seq_length, self.spec.max_segments, self.spec.seed
        #: the segment alignment (``ThdLayout.pad_multiple``), derived from cp/tp/sp/eval_cp
        self.pad_multiple = self.spec.alignment
        self.window, self.shuffle, self.seed = window, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        #: whether ``balance`` was left to its default (then a restored state's mode is adopted)
        self._balance_defaulted = self.spec.balance_defaulted
        #: (slack, room_weight) of the balanced packer: the defaults, or a restored state's (load_state_dict)
        self._balance_tuning = (DEFAULT_SLACK, DEFAULT_ROOM_WEIGHT)
        self._set_balance(self.spec.balance, knobs.get("cost_model"))
        #: lines never yielded, by reason: the dataset's ("unusable" for lengths <= 0 it does not name) + oversize
        self.skips = Counter(self._dataset.skips) if self._dataset is not None else Counter()
        unnamed = int((self.lengths <= 0).sum()) - sum(self.skips.values())
        if unnamed > 0:
            self.skips["unusable"] += unnamed
        over = int(self._oversize().sum())
        if over:
            self.skips[OVERSIZE] += over
        if self._dataset is not None:
            self._require_batches()
        self.epoch = 0
        self._start = 0  # first step of the next __iter__ (set by load_state_dict)
        self._yielded = 0
        self._plan_cache: tuple[int, list[list[int]], PackingStats] | None = None

    @classmethod
    def from_spec(cls, lengths: Any, spec: PackingSpec, **sampler_knobs: Any) -> TokenBudgetBatchSampler:
        """The sampler of ``spec``'s knobs (its width, alignment, segment budget, seed, balance and cost model);
        ``sampler_knobs``: ``window``, ``shuffle``, ``num_replicas``, ``rank``."""
        knobs = ("cp", "tp", "sp", "eval_cp", "max_segments", "seed", "cost_model")
        balance = None if spec.balance_defaulted else spec.balance
        return cls(lengths, spec.seq_length, balance=balance, **{k: getattr(spec, k) for k in knobs}, **sampler_knobs)

    @property
    def width(self) -> int:
        """Deprecated name of :attr:`seq_length` (reading it warns)."""
        warn_old_width("TokenBudgetBatchSampler.width")
        return self.seq_length

    # ------------------------------------------------------------------ the plan
    def plan(self, epoch: int | None = None) -> list[list[int]]:
        """All micro-batches of the epoch for all ranks, in global step order (identical on every rank)."""
        return self._planned(self.epoch if epoch is None else epoch)[0]

    @property
    def stats(self) -> PackingStats:
        """Fill and skips of the current epoch's plan (all ranks; padding micro-batches excluded)."""
        return self._planned(self.epoch)[1]

    def _planned(self, epoch: int) -> tuple[list[list[int]], PackingStats]:
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (epoch, *self._build_plan(epoch))
        return self._plan_cache[1], self._plan_cache[2]

    def _build_plan(self, epoch: int) -> tuple[list[list[int]], PackingStats]:
        rng = np.random.default_rng([self.seed, epoch])
        spans = aligned_length(self.lengths, self.pad_multiple)
        stats = PackingStats(skips=Counter(self.skips))
        order = np.flatnonzero((self.lengths > 0) & (spans <= self.seq_length))
        if self.shuffle:
            order = rng.permutation(order)
        capacity = (self.seq_length,) if self.max_segments is None else (self.seq_length, self.max_segments)
        plan: list[list[int]] = []
        for start in range(0, len(order), self.window):
            idx = order[start : start + self.window]
            costs = spans[idx, None] if self.max_segments is None else np.stack([spans[idx], np.ones_like(idx)], axis=1)
            groups = self._balanced(costs, capacity) if self._step_cost else best_fit_decreasing(costs, capacity).groups
            for g in rng.permutation(len(groups)) if self.shuffle else range(len(groups)):
                group = groups[g]
                plan.append([int(i) for i in idx[group]])
                stats.record_pack([(int(self.lengths[i]),) for i in idx[group]], (self.seq_length,))
        return plan, stats

    def _balanced(self, costs: np.ndarray, capacity: tuple[int, ...]) -> list[list[int]]:
        """One window's packs (positions in it) from the compute-balanced packer, streamed in window order."""
        slack, room_weight = self._balance_tuning
        packer = ComputeBalancedPacker(
            capacity, buffer_size=min(self.window, BALANCE_BUFFER), slack=slack, room_weight=room_weight
        )
        groups: list[list[int]] = []
        for pos, cost in enumerate(costs.tolist()):
            groups.extend(packer.push(pos, tuple(cost), self._step_cost.sample_cost(cost[0])))
        return groups + packer.flush()

    def _oversize(self) -> np.ndarray:
        return (self.lengths > 0) & (aligned_length(self.lengths, self.pad_multiple) > self.seq_length)

    def _require_batches(self) -> None:
        if len(self.lengths) and sum(self.skips.values()) == len(self.lengths):
            raise self._all_skipped_error()

    def _all_skipped_error(self) -> AllSkippedError:
        top = max(self.skips, key=self.skips.get)
        if top == OVERSIZE:
            i = int(np.flatnonzero(self._oversize())[0])
            example = f"line {i + 1}: {self.lengths[i]} tokens > width {self.seq_length}"
        else:
            example = self._dataset.skip_example(top) if self._dataset is not None else None
        who = "TokenBudgetBatchSampler" + (f" over {self._dataset.path}" if self._dataset is not None else "")
        too_long = (
            Hint(
                f"{{seq_length}} ({self.seq_length}) or {{max_length}} may be too small for these lines",
                ("seq_length", "max_length"),
                python=(("seq_length", "the width"), ("max_length", "the dataset's max_length")),
            ),
            Hint("set {overlength}='truncate' on the dataset", ("overlength",), sep=", or "),
        )
        mismatch = Hint.plain(
            self._dataset.mismatch_hint()
            if self._dataset is not None
            else "the records may not match the dataset's format: check its skipped_lines"
        )
        return AllSkippedError(
            f"{who}: all {len(self.lengths)} lines were skipped, so there is no batch",
            who=who,
            skips=self.skips,
            example=example,
            hints=all_skipped_hints(self.skips, too_long=too_long, mismatch=mismatch),
        )

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        """Steps per rank this epoch (the same on every rank)."""
        self._require_batches()
        return -(-len(self.plan()) // self.num_replicas)

    @property
    def padding_steps(self) -> int:
        """Padding micro-batches this rank gets this epoch (synthetic, zero loss)."""
        return sum(1 for s in range(len(self)) if s * self.num_replicas + self.rank >= len(self.plan()))

    def __iter__(self) -> Iterator[list[int]]:
        self._require_batches()
        self.plan()  # now, in the process that calls iter(): before a DataLoader starts its workers
        return self._steps()

    def _steps(self) -> Iterator[list[int]]:
        plan, steps = self.plan(), len(self)
        start, self._start = self._start, 0
        self._yielded = start
        for step in range(start, steps):
            j = step * self.num_replicas + self.rank
            self._yielded = step + 1
            yield list(plan[j]) if j < len(plan) else [PADDING_INDEX]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its seeded order) and start it from the first step."""
        self.epoch, self._start, self._yielded = int(epoch), 0, 0

    # ------------------------------------------------------------------ checkpointing
    def _set_balance(self, balance: str, cost_model: Any) -> None:
        self.balance, self.cost_model = balance, cost_model
        self._step_cost = self.cost_model_name = None
        if balance == "compute":
            road = "the SFT sampler"
            self._step_cost, self.cost_model_name = resolve_cost_model(cost_model, road=road)
        elif cost_model is not None:
            self.cost_model_name = cost_model_name(cost_model_from(cost_model))  # validated even when unused
        self._plan_cache = None

    def _config(self) -> dict[str, Any]:
        # "width": the key checkpoints saved before the rename to seq_length hold, so they still load
        return {
            "width": self.seq_length,
            "pad_multiple": self.pad_multiple,
            "max_segments": self.max_segments,
            "window": self.window,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "lengths": hashlib.blake2b(self.lengths.tobytes(), digest_size=8).hexdigest(),
            # only when set: checkpoints of tokens-balanced runs, saved before the knob existed, still load
            **(
                {
                    "balance": self.balance,
                    "cost_model": self.cost_model_name,
                    "balance_tuning": list(self._balance_tuning),
                }
                if self.balance != "tokens"
                else {}
            ),
        }

    def state_dict(self, steps_consumed: int | None = None) -> dict[str, Any]:
        """Epoch + step to resume at. Pass ``steps_consumed`` (steps the trainer finished this
        epoch): a DataLoader prefetches, so the sampler's own count runs ahead of training."""
        step = self._yielded if steps_consumed is None else int(steps_consumed)
        return {"format": STATE_FORMAT, "epoch": self.epoch, "step": step, "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``__iter__`` continues the saved epoch at the saved step, bit for bit."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported sampler state format {state.get('format')!r}")
        saved = dict(state["config"])
        if self._balance_defaulted and saved.get("balance", "tokens") != self.balance:
            # balance left to its default: continue the run the state was saved in, in its own mode
            self._set_balance(saved.get("balance", "tokens"), self.cost_model)
        mine, tuning = self._config(), None
        if self.balance == "compute" and saved.get("balance") == "compute":
            # the plan of a balanced run depends on the packer's tuning: continue with the one it was saved
            # under (a state without it predates the key: the tuning of that release)
            tuning = tuple(float(x) for x in saved.get("balance_tuning", PRE_KEY_BALANCE_TUNING))
            saved["balance_tuning"] = mine["balance_tuning"] = list(tuning)
        if "cost_model" in saved and same_cost_model(saved["cost_model"], mine.get("cost_model")):
            saved["cost_model"] = mine.get("cost_model")  # the same model (a state saved before stable names too)
        diff = sorted(k for k in {*mine, *saved} if saved.get(k) != mine.get(k))
        if diff:
            hint = (
                f"; it was saved with balance={saved.get('balance', 'tokens')!r}: pass that (or leave balance unset)"
                if "balance" in diff
                else ""
            )
            raise ValueError(
                f"sampler state was saved with a different {diff}: exact resume needs the same data, "
                f"width, alignment, window, seed, balance and data-parallel layout{hint}"
            )
        if tuning is not None and tuning != self._balance_tuning:
            self._balance_tuning, self._plan_cache = tuning, None
        self.epoch, self._start, self._yielded = int(state["epoch"]), int(state["step"]), int(state["step"])
