"""The packing configuration shared by our Energon task encoders, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.packing.balanced import BALANCE_MODES
from energon_pack.thd import OVERLENGTH_POLICIES, ThdLayout, alignment_multiple

PACKING_MODES = ("carry", "rounds")
#: knobs only the tokens-only carry packer has (setting one, with balance unset, selects it)
TOKENS_PACKER_KNOBS = ("lookahead_packs", "min_fill", "max_age")
#: Knobs that may change between save and restore (they do not change which packs come next).
RESUME_SAFE_KNOBS = ("skip_guard", "skip_warn_rate", "skip_warn_window")


@dataclass(frozen=True)
class PackingConfig:
    """Pack width and layout (THD), packer knobs, and optional extra budgets per pack.

    Costs are (aligned tokens[, ViT patches][, media items]); the optional budgets bound the
    vision work one pack may carry. Every knob except ``skip_guard`` and the ``skip_warn_*`` knobs
    is stored as a fingerprint in the checkpoint; restoring with a different value raises
    ``ConfigError`` naming the knob (they change which packs come next; the others do not).

    Attributes:
        seq_length: the pack width in tokens (token slots of one THD row, Megatron's ``seq_length``): the
            first budget of every pack. Must be a multiple of the alignment multiple of ``cp``/``tp``/
            ``sp``/``eval_cp``. Default 8192: several times a typical SFT sample (about 21 demo samples per
            pack with the real Qwen2.5-VL tokenizer), the width the docs' examples and benchmarks use.
        cp: the context-parallel size the packs are trained with (1 = off). Each segment is padded to a
            multiple of ``2 * cp`` when ``cp > 1``. Default 1: no context parallelism, no alignment.
            Must equal the model's (``check_bridge_config`` checks it).
        tp: the tensor-parallel size (1 = off). It aligns segments only together with ``sp``
            (to a multiple of ``cp * tp``). Default 1: no tensor parallelism.
        sp: whether sequence parallelism is on (with ``tp > 1`` it adds the ``cp * tp`` multiple).
            Default False: Megatron's default.
        eval_cp: the context-parallel size of evaluation when it differs from ``cp`` (Bridge's
            ``dist.eval_context_parallel_size``); segments are aligned to the lcm of both multiples, so the
            same packs serve training and evaluation. Default None: evaluation uses ``cp``.
        pad_to_max_length: make every row exactly ``seq_length`` tokens (a pad tail after the last
            segment). Default False: a row ends after its last segment's aligned span, so no compute is spent
            on a tail; set True for fixed shapes (Bridge with expert parallelism, CUDA graphs).
        pad_cu_seqlens: give the four ``cu_seqlens_*`` arrays the static length ``max_segments + 1``
            (zero-length segments repeat the last boundary; ``max_seqlen_*`` is the width), for CUDA graphs.
            Needs ``pad_to_max_length=True`` and ``max_segments``. Default False: one entry per segment.
        max_segments: the most segments (samples) one pack may hold, a count; when set it is also a packer
            budget (each sample costs 1), so static cu_seqlens always fit. Default None: no limit.
        max_media_per_pack: the most media items (images plus videos) one pack may hold, a count; a
            packer budget. Default None: no media budget (tokens alone decide).
        max_patches_per_pack: the most ViT patches (the product of each ``grid_thw``, before the spatial
            merge) one pack may hold; a packer budget that bounds the vision tower's work per step, and the
            padded patch-row count of static packs (``static_visual=True`` needs it, a multiple of
            ``merge_size**2``). Default None: no patch budget.
        packing_mode: ``"carry"`` (our carry-over packer: open bins carried across buffer rounds) or
            ``"rounds"`` (Energon's own ``PackingDataset`` with first-fit-decreasing over each buffer of
            ``packing_buffer_size`` samples, for comparison). Default ``"carry"``: 99.8% fill at K=64 on the
            demo data against 86.4% for rounds.
        lookahead_packs: carry mode: the most tokens held in open bins, in packs' worth (a float, e.g. 4.0
            = ``4 * seq_length`` tokens); over it the fullest bin leaves. Default None: only
            ``packing_buffer_size`` (samples held per worker) bounds the packer, Energon's meaning of K.
        min_fill: carry mode: a bin leaves as soon as this fraction of ``seq_length`` is used, in (0, 1].
            Default None: a bin leaves only when nothing seen could still fit it, or on the buffer bound, which
            fills best.
        max_age: carry mode: the most samples pushed to the worker's packer while a bin stays open (bounds
            a sample's delay, in samples). Default None: no limit (fill first).
        overlength: what a sample over a budget (longer than ``seq_length`` tokens, or over a patch/media
            budget) gets: ``"skip"`` (a counted ``oversize`` skip), ``"error"`` (a ConfigError naming the
            sample, under every ``balance`` and ``packing_mode``) or ``"truncate"`` (cut to ``seq_length``
            tokens: the text encoder only; the Qwen-VL encoder refuses it, it would cut visual tokens). Default
            ``"skip"``: one bad sample does not stop a run and every skip is counted in ``packing_stats``.
        balance: carry mode: ``"tokens"`` (packs full in tokens) or ``"compute"`` (full in tokens *and* about
            equal in step cost under ``cost_model``: attention per segment squared, vision patches; ranks then
            wait less for their slowest, with no communication; :class:`~energon_pack.packing.balanced.
            ComputeBalancedPacker`, holding ``packing_buffer_size`` samples). Default None: ``"compute"`` in
            carry mode (on the bench mix it costs 0.15 fill points at K=256, 0.21 at K=64, and lifts the
            predicted DP-8 efficiency from 0.91 to 0.98: ``python -m energon_pack.bench.balance_bench``),
            ``"tokens"`` in rounds mode (Energon's rounds are packed by tokens) or when ``lookahead_packs``,
            ``min_fill`` or ``max_age`` is set (knobs of the tokens-only packer; with ``"compute"`` they are
            an error). A checkpoint saved under the other mode (every one saved before this default packed by
            tokens) is refused by name: restore it with ``balance="tokens"``.
        cost_model: the step-cost model ``balance="compute"`` equalises, best the model you train: a shape of
            :data:`energon_pack.packing.step_cost.SHAPES` (e.g. ``"qwen2.5-vl-3b"``, FLOP-derived), a fitted model
            of :data:`~energon_pack.packing.step_cost.FITTED`, a path to a fitted cost-model JSON
            (``StepCostModel.as_dict()``), a transformers Qwen2-VL / Qwen2.5-VL / Qwen3-VL config or model, or a
            Megatron-Bridge model provider; resolved here to a ``StepCostModel`` (a wrong form is a ConfigError
            naming the knob). Default None: the model the road can see (Bridge's ``cfg.model`` through
            ``check_bridge_config``), else the 7B/8B shape of the Qwen-VL preset (Qwen2.5-VL-7B's LLM for text),
            said in one log line (:func:`~energon_pack.packing.step_cost.resolve_cost_model`).
        seed: carry mode: the seed of the order in which the last open bins are emitted at the end of a
            finite stream. Default 0: fixed, so the same data gives the same packs.
        skip_guard: a worker that has skipped this many samples without emitting a single pack raises
            ``AllSkippedError`` naming the skip reasons and counts, instead of hanging on a stream where
            nothing can ever be packed (wrong field names, width too small, wrong encoder); a count of
            samples. Default None: ``max(1000, 10 * packing_buffer_size)``, far more than one pack needs. A
            finite stream that ends before the limit with 0 packs warns with the same message.
        skip_warn_rate: a worker logs one warning (and a ``RuntimeWarning``) the first time at least this
            fraction, in (0, 1], of ``skip_warn_window`` consecutive samples it read were skipped, with the
            skip reasons, their counts and one example per reason, so mostly-skipped data does not look
            healthy. Default 0.5: half the data lost is never normal; None turns the warning off.
        skip_warn_window: the window of ``skip_warn_rate``, in consecutive samples read by one worker.
            Default 200: enough samples that a few bad records do not trigger it.
    """

    seq_length: int = 8192
    cp: int = 1
    tp: int = 1
    sp: bool = False
    eval_cp: int | None = None
    pad_to_max_length: bool = False
    pad_cu_seqlens: bool = False
    max_segments: int | None = None
    max_media_per_pack: int | None = None
    max_patches_per_pack: int | None = None
    packing_mode: str = "carry"
    lookahead_packs: float | None = None
    min_fill: float | None = None
    max_age: int | None = None
    overlength: str = "skip"
    balance: str | None = None
    cost_model: Any = None
    seed: int = 0
    skip_guard: int | None = None
    skip_warn_rate: float | None = 0.5
    skip_warn_window: int = 200

    def __post_init__(self) -> None:
        if self.packing_mode not in PACKING_MODES:
            raise ConfigError("packing_mode", f"unknown mode {self.packing_mode!r}", f"use one of {PACKING_MODES}")
        tokens_knobs = [k for k in TOKENS_PACKER_KNOBS if getattr(self, k) is not None]
        if self.balance is None:  # the default follows the mode and the knobs: only carry balances compute
            balanced = self.packing_mode == "carry" and not tokens_knobs
            object.__setattr__(self, "balance", "compute" if balanced else "tokens")
            object.__setattr__(self, "_balance_defaulted", True)  # build() re-derives it (not a field)
        if self.balance not in BALANCE_MODES:
            raise ConfigError("balance", f"unknown mode {self.balance!r}", f"use one of {BALANCE_MODES}")
        if self.balance == "compute" and tokens_knobs:
            raise ConfigError(
                tokens_knobs[0],
                "is a knob of the tokens-only carry packer; balance='compute' builds each pack from the "
                "packing_buffer_size samples it holds",
                f"drop {tokens_knobs[0]}, or pass balance='tokens' to keep it",
            )
        if self.balance == "compute" and self.packing_mode != "carry":
            raise ConfigError(
                "balance",
                f"'compute' balances the carry packer; packing_mode={self.packing_mode!r} packs Energon's rounds",
                "use packing_mode='carry' with balance='compute'",
            )
        if self.cost_model is not None:  # one resolved, light, picklable model (a ConfigError names a wrong form)
            from energon_pack.packing.step_cost import cost_model_from

            object.__setattr__(self, "cost_model", cost_model_from(self.cost_model))
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ConfigError("overlength", f"unknown policy {self.overlength!r}", f"use one of {OVERLENGTH_POLICIES}")
        if self.skip_guard is not None and (
            not isinstance(self.skip_guard, int) or isinstance(self.skip_guard, bool) or self.skip_guard < 1
        ):
            raise ConfigError(
                "skip_guard",
                f"must be a positive int or None, got {self.skip_guard!r}",
                "leave it None for max(1000, 10 * packing_buffer_size)",
            )
        rate = self.skip_warn_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1):
            raise ConfigError(
                "skip_warn_rate",
                f"must be a fraction in (0, 1] or None, got {rate!r}",
                "use e.g. 0.5 (warn when half the samples of a window are skipped), or None for no warning",
            )
        window = self.skip_warn_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError("skip_warn_window", f"must be a positive int, got {window!r}", "use e.g. 200 samples")
        for knob in ("max_media_per_pack", "max_patches_per_pack"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(knob, f"must be a positive int or None, got {value!r}", "leave it None for no budget")
        self.layout()  # validates width, alignment and static cu_seqlens knobs

    @classmethod
    def build(cls, base: PackingConfig | None = None, **overrides: Any) -> PackingConfig:
        """``base`` with ``overrides`` applied; an unknown knob raises ConfigError naming it."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(unknown[0], "is not a packing knob", f"use one of {sorted(names)}")
        values = {f.name: getattr(base, f.name) for f in fields(cls)} if base is not None else {}
        if getattr(base, "_balance_defaulted", False):
            values["balance"] = None  # a defaulted balance follows the new packing_mode
        return cls(**{**values, **overrides})

    def layout(self, pad_token_id: int = 0) -> ThdLayout:
        return ThdLayout(
            seq_length=self.seq_length,
            pad_multiple=alignment_multiple(self.cp, self.tp, self.sp, self.eval_cp),
            pad_to_max_length=self.pad_to_max_length,
            pad_cu_seqlens=self.pad_cu_seqlens,
            max_segments=self.max_segments,
            pad_token_id=pad_token_id,
        )

    def capacity(self) -> tuple[int, ...]:
        """A pack's budgets: tokens, then patches, media and segments where set (``max_segments`` is a
        budget so static cu_seqlens always fit)."""
        budgets = (self.max_patches_per_pack, self.max_media_per_pack, self.max_segments)
        return (self.seq_length, *(b for b in budgets if b is not None))

    def cost(self, aligned_tokens: int, patches: int = 0, media: int = 0) -> tuple[int, ...]:
        """One sample's cost in the budgets of :meth:`capacity` (one segment per sample)."""
        pairs = ((patches, self.max_patches_per_pack), (media, self.max_media_per_pack), (1, self.max_segments))
        return (aligned_tokens, *(value for value, budget in pairs if budget is not None))

    def packer_options(self) -> dict[str, Any]:
        return {
            "lookahead_packs": self.lookahead_packs,
            "min_fill": self.min_fill,
            "max_age": self.max_age,
            "on_oversize": "error" if self.overlength == "error" else "skip",
            "seed": self.seed,
        }
