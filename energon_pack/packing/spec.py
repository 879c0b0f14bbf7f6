"""PackingSpec: the path-neutral packing knobs, declared once, validated once, read by every road.

The Energon encoders (:class:`~energon_pack.energon.config.PackingConfig` adds the Energon-only knobs to it), the
GPT-SFT sampler and in-batch packer, the Megatron-Bridge providers and the CLI flags are all built from this one
object: one name per knob, one docstring per knob (:data:`KNOB_DOCS`, also the CLI help), one default rule for
``balance`` (:func:`default_balance`), one validation (``ConfigError(knob, problem, fix)``).

Names the roads used before (``width``, ``pad_multiple``, Bridge's ``packed_sequence_size`` ...) are in
:data:`OLD_NAMES`: each is either accepted with one ``DeprecationWarning`` naming the new knob, or refused with a
ConfigError naming it (:func:`renamed_knobs`, :func:`accepts_old_names`).
"""

from __future__ import annotations

import functools
import numbers
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ..errors import ConfigError
from .balanced import BALANCE_MODES
from .layout_rules import OVERLENGTH_POLICIES, alignment_multiple, check_layout_knobs

__all__ = [
    "KNOB_DOCS",
    "OLD_NAMES",
    "PackingSpec",
    "OldName",
    "accepts_old_names",
    "alignment_knobs",
    "DEFAULTS",
    "default_balance",
    "knob_help",
    "renamed_knobs",
    "spec_for",
    "spec_knobs",
]


def default_balance(tokens_only: tuple[str, ...] = ()) -> str:
    """The one default rule of ``balance`` on every road: ``"compute"``, unless the road names a reason it can only
    pack by tokens (``tokens_only``: e.g. Energon's ``packing_mode='rounds'``, or a knob of the tokens-only carry
    packer), then ``"tokens"``."""
    return "tokens" if tokens_only else "compute"


@dataclass(frozen=True)
class PackingSpec:
    """The packing knobs every road shares (module doc), validated at construction.

    Costs are (aligned tokens[, ViT patches][, media items][, segments]); the optional budgets bound the work one
    pack may carry. Every knob is part of a road's resume fingerprint (it changes which packs come next).

    Attributes:
        seq_length: the pack width in tokens (token slots of one THD row, Megatron's ``seq_length``): the first
            budget of every pack. Must be a multiple of the alignment of ``cp``/``tp``/``sp``/``eval_cp``. Default
            8192: several times a typical SFT sample (about 21 demo samples per pack with the real Qwen2.5-VL
            tokenizer), the width the docs' examples and benchmarks use. Old names ``width``,
            ``packed_sequence_size``.
        cp: the context-parallel size the packs are trained with (1 = off). Each segment is padded to a multiple
            of ``2 * cp`` when ``cp > 1``. Default 1: no context parallelism, no alignment. Must equal the model's
            (``check_bridge_config`` checks it). With ``tp``/``sp``/``eval_cp`` it replaces the old explicit
            ``pad_multiple`` / ``pad_seq_to_mult`` (see :attr:`alignment`).
        tp: the tensor-parallel size (1 = off). It aligns segments only together with ``sp`` (to a multiple of
            ``cp * tp``). Default 1: no tensor parallelism.
        sp: whether sequence parallelism is on (with ``tp > 1`` it adds the ``cp * tp`` multiple). Default False:
            Megatron's default.
        eval_cp: the context-parallel size of evaluation when it differs from ``cp`` (Bridge's
            ``dist.eval_context_parallel_size``); segments are aligned to the lcm of both multiples, so the same
            packs serve training and evaluation. Default None: evaluation uses ``cp``.
        pad_to_max_length: make every row exactly ``seq_length`` tokens (a pad tail after the last segment).
            Default False: a row ends after its last segment's aligned span, so no compute is spent on a tail; set
            True for fixed shapes (Bridge with expert parallelism, CUDA graphs).
        pad_cu_seqlens: give the four ``cu_seqlens_*`` arrays the static length ``max_segments + 1`` (zero-length
            segments repeat the last boundary; ``max_seqlen_*`` is the width), for CUDA graphs. Needs
            ``pad_to_max_length=True`` and ``max_segments``. Default False: one entry per segment.
        max_segments: the most segments (samples) one pack may hold, a count; when set it is also a packer budget
            (each sample costs 1), so static cu_seqlens always fit. Default None: no limit.
        max_media_per_pack: the most media items (images plus videos) one pack may hold, a count; a packer
            budget. Default None: no media budget (tokens alone decide).
        max_patches_per_pack: the most ViT patches (the product of each ``grid_thw``, before the spatial merge)
            one pack may hold; a packer budget that bounds the vision tower's work per step, and the padded
            patch-row count of static packs (``static_visual=True`` needs it, a multiple of ``merge_size**2``).
            Default None: no patch budget.
        overlength: what a sample over a budget gets: ``"skip"`` (default; counted as ``oversize``), ``"error"``
            (raises naming it), ``"truncate"`` (text roads: its first seq_length tokens), ``"fit"`` (Qwen-VL: its
            images' and videos' pixels, then its video frames, lowered until it fits; counted as ``fitted``
            adjustments with pixels before/after; text alone over the width is an ``oversize_text`` skip) or
            ``"split"`` (Qwen-VL: a multi-turn conversation cut at user turns into pieces that fit, each with its own
            media and the system prompt repeated; counted as ``split`` / ``split_pieces``). A budget is
            ``seq_length`` tokens or a patch/media budget; each policy is spelled out in
            :data:`energon_pack.packing.layout_rules.OVERLENGTH_MEANINGS`; ``"error"`` raises under every
            ``balance``. The default
            ``"skip"``: one bad sample does not stop a run and every skip is counted in the stats.
        balance: ``"tokens"`` (packs full in tokens) or ``"compute"`` (full in tokens *and* about equal in step cost
            under ``cost_model``: attention per segment squared, vision patches; data-parallel ranks then wait less for
            their slowest, with no communication; on public mixes it was not tuned on, public mix
            ``scripts/public_mix.py`` photos / video, K=64, width 8192, ``cost_model="qwen2.5-vl-3b"``, packs priced by
            an independent Qwen2.5-VL-3B FLOP count: 0.26 / 0.27 fill points below tokens-only, predicted DP-8
            efficiency from 0.847 to 0.972 / from 0.889 to 0.974: ``python -m energon_pack.bench.balance_bench --data
            PATH``). Default None: :func:`default_balance`, the one rule of every road: ``"compute"``, unless the road
            can only pack by tokens (Energon's ``packing_mode="rounds"``, a knob of the tokens-only carry packer). A
            checkpoint saved under the other mode is refused by name (restore it with the mode it names); a defaulted
            SFT sampler continues a state in the state's mode.
        cost_model: the step-cost model ``balance="compute"`` equalises, best the model you train: a shape of
            :data:`energon_pack.packing.step_cost.SHAPES` (e.g. ``"qwen2.5-vl-3b"``, FLOP-derived), a fitted model
            of :data:`~energon_pack.packing.step_cost.FITTED`, a path to a fitted cost-model JSON, a transformers
            Qwen2-VL / Qwen2.5-VL / Qwen3-VL config or model, or a Megatron-Bridge model provider; resolved here
            to a ``StepCostModel`` (a wrong form is a ConfigError naming the knob). Default None: the model the
            road can see (Bridge's ``cfg.model``), else the 7B/8B shape of the Qwen-VL preset (Qwen2.5-VL-7B's LLM
            for text), said in one log line (:func:`~energon_pack.packing.step_cost.resolve_cost_model`).
        seed: the seed of the packer's own order (the SFT plan's shuffle of lines and packs, the order the carry
            packer's last open bins leave at the end of a finite stream). Default 0: fixed, so the same data gives
            the same packs.
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
    overlength: str = "skip"
    balance: str | None = None
    cost_model: Any = None
    seed: int = 0

    def __post_init__(self) -> None:
        for knob in ("sp", "pad_to_max_length", "pad_cu_seqlens"):
            if not isinstance(getattr(self, knob), bool):
                raise ConfigError(
                    knob, f"must be True or False, got {getattr(self, knob)!r}", f"pass {knob}=True/False"
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ConfigError("seed", f"must be an integer, got {self.seed!r}", "pass an int, e.g. seed=0")
        if self.balance is None:  # the one default rule (the road's reasons to pack by tokens: _tokens_only)
            object.__setattr__(self, "balance", default_balance(self._tokens_only()))
            object.__setattr__(self, "_balance_defaulted", True)  # build() re-derives it (not a field)
        if self.balance not in BALANCE_MODES:
            raise ConfigError("balance", f"unknown mode {self.balance!r}", f"use one of {BALANCE_MODES}")
        if self.cost_model is not None:  # one resolved, light, picklable model (a ConfigError names a wrong form)
            from .step_cost import cost_model_from

            object.__setattr__(self, "cost_model", cost_model_from(self.cost_model))
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ConfigError("overlength", f"unknown policy {self.overlength!r}", f"use one of {OVERLENGTH_POLICIES}")
        for knob in ("max_media_per_pack", "max_patches_per_pack"):
            value = getattr(self, knob)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(knob, f"must be a positive int or None, got {value!r}", "leave it None for no budget")
        align, width = self.alignment, self.seq_length  # alignment_multiple validates cp, tp and eval_cp
        if isinstance(width, int) and not isinstance(width, bool) and width >= 1 and width % align:
            lower = width // align * align or align
            parts = (f"cp={self.cp}" * (self.cp > 1), f"tp={self.tp}" * (self.tp > 1), "sp=True" * self.sp)
            of = ", ".join(p for p in (*parts, f"eval_cp={self.eval_cp}" * bool(self.eval_cp)) if p)
            raise ConfigError(
                "seq_length",
                f"{width} is not divisible by the alignment {align} of {of}",
                f"use a multiple of {align} for seq_length (e.g. {lower} or {lower + align}), or change {of}",
            )
        check_layout_knobs(width, align, self.pad_to_max_length, self.pad_cu_seqlens, self.max_segments)

    def _tokens_only(self) -> tuple[str, ...]:
        """The road's reasons it can only pack by tokens (none here; a road's subclass names its own)."""
        return ()

    @property
    def balance_defaulted(self) -> bool:
        """Whether ``balance`` was left to :func:`default_balance`."""
        return bool(getattr(self, "_balance_defaulted", False))

    @property
    def alignment(self) -> int:
        """Every segment's span is its length rounded up to this: Megatron-Bridge's lcm rule over ``cp``, ``tp``,
        ``sp`` and ``eval_cp`` (:func:`~energon_pack.packing.layout_rules.alignment_multiple`);
        ``ThdLayout.pad_multiple``."""
        return alignment_multiple(self.cp, self.tp, self.sp, self.eval_cp)

    @classmethod
    def build(cls, base: PackingSpec | None = None, **overrides: Any) -> Any:
        """``base`` with ``overrides`` applied (old names through :data:`OLD_NAMES`); an unknown knob raises
        ConfigError naming it. A defaulted ``balance`` of ``base`` is derived again."""
        overrides = renamed_knobs(cls.__qualname__, overrides)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(unknown[0], "is not a packing knob", f"use one of {sorted(names)}")
        values = {f.name: getattr(base, f.name) for f in fields(cls) if hasattr(base, f.name)} if base else {}
        if base is not None and base.balance_defaulted:
            values["balance"] = None  # a defaulted balance follows the new knobs
        return cls(**{**values, **overrides})

    def spec(self) -> PackingSpec:
        """The path-neutral part alone (a :class:`PackingSpec` of the same knobs)."""
        return PackingSpec(**{f.name: getattr(self, f.name) for f in fields(PackingSpec)})

    def capacity(self) -> tuple[int, ...]:
        """A pack's budgets: tokens, then patches, media and segments where set (``max_segments`` is a
        budget so static cu_seqlens always fit)."""
        budgets = (self.max_patches_per_pack, self.max_media_per_pack, self.max_segments)
        return (self.seq_length, *(b for b in budgets if b is not None))

    def cost(self, aligned_tokens: int, patches: int = 0, media: int = 0) -> tuple[int, ...]:
        """One sample's cost in the budgets of :meth:`capacity` (one segment per sample)."""
        pairs = ((patches, self.max_patches_per_pack), (media, self.max_media_per_pack), (1, self.max_segments))
        return (aligned_tokens, *(value for value, budget in pairs if budget is not None))


def spec_knobs() -> tuple[str, ...]:
    """The knob names of :class:`PackingSpec`, in declaration order."""
    return tuple(f.name for f in fields(PackingSpec))


#: each knob's default, as :class:`PackingSpec` declares it (the roads read it from here, never re-declare it)
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(PackingSpec)}


def spec_for(owner: str, knobs: Mapping[str, Any], allowed: tuple[str, ...], **given: Any) -> PackingSpec:
    """The :class:`PackingSpec` of a road that takes the spec's ``allowed`` knobs as keywords (``knobs``, old names
    already renamed) plus ``given``; a knob the road has no use for is a ConfigError naming the ones it takes."""
    extra = sorted(set(knobs) - set(allowed))
    if extra:
        known = "a packing knob" if extra[0] in DEFAULTS else "a knob"
        raise ConfigError(extra[0], f"is not {known} of {owner}", f"use one of {', '.join(allowed)}")
    return PackingSpec(**given, **knobs)


def _knob_docs(doc: str) -> dict[str, str]:
    """``{knob: its text}`` from the ``Attributes:`` section of a class docstring (one paragraph per knob)."""
    section = doc.split("Attributes:", 1)[1]
    parts = re.split(r"^ {8}(\w+): ", section, flags=re.M)
    return {name: " ".join(text.split()) for name, text in zip(parts[1::2], parts[2::2])}


#: one docstring per knob (the ``Attributes:`` of :class:`PackingSpec`): the help of every road and CLI flag
KNOB_DOCS: dict[str, str] = _knob_docs(PackingSpec.__doc__ or "")


def knob_help(knob: str) -> str:
    """The first sentence of ``knob``'s docstring (:data:`KNOB_DOCS`), as argparse help text (plain text: no reST
    roles or literals; ``%`` escaped)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", KNOB_DOCS[knob]).replace("``", "").replace("%", "%%")
    first = re.split(r"(?<=[.:])\s+(?=[A-Z])", text, maxsplit=1)[0]
    return first.rstrip(".")


# ---------------------------------------------------------------------------------------------- old names
def alignment_knobs(multiple: Any) -> dict[str, Any]:
    """The ``cp``/``tp``/``sp`` whose derived alignment is exactly ``multiple`` (an even N: ``cp=N//2``, Megatron's
    ``2*cp``; an odd N > 1: ``tp=N, sp=True``; 1: nothing)."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(
            "pad_multiple", f"must be an integer >= 1, got {multiple!r}", "pass cp/tp/sp (the alignment is derived)"
        )
    if multiple == 1:
        return {}
    return {"cp": multiple // 2} if multiple % 2 == 0 else {"tp": multiple, "sp": True}


@dataclass(frozen=True)
class OldName:
    """A knob name a road used before: ``new`` (the knob(s) now, as messages name them); ``accepted``: mapped with
    one DeprecationWarning (``convert`` turns the old value into new knobs; default ``{new: value}``), else refused
    with a ConfigError naming ``new``."""

    new: str
    accepted: bool = True
    convert: Callable[[Any], dict[str, Any]] | None = None
    note: str = ""

    def new_knobs(self, value: Any) -> dict[str, Any]:
        return self.convert(value) if self.convert is not None else {self.new: value}


#: every name a road used for a spec knob before: accepted (one DeprecationWarning) or refused (ConfigError),
#: always naming the new knob
OLD_NAMES: dict[str, OldName] = {
    "width": OldName("seq_length"),
    "packed_sequence_size": OldName("seq_length", note="Bridge's PackedSequenceSpecs name"),
    "pad_multiple": OldName(
        "cp/tp/sp", convert=alignment_knobs, note="the alignment is derived from them: pad_multiple=2*N is cp=N"
    ),
    "pad_seq_to_mult": OldName(
        "cp/tp/sp", convert=alignment_knobs, note="the alignment is derived from them: pad_seq_to_mult=2*N is cp=N"
    ),
    "max_seq_length": OldName("seq_length", accepted=False),
    "on_oversize": OldName("overlength", accepted=False, note="the packers' internal option"),
    "context_parallel_size": OldName("cp", accepted=False),
    "tensor_model_parallel_size": OldName("tp", accepted=False),
    "sequence_parallel": OldName("sp", accepted=False),
    "eval_context_parallel_size": OldName("eval_cp", accepted=False),
    "max_images_per_pack": OldName("max_media_per_pack", accepted=False),
    "max_patches": OldName("max_patches_per_pack", accepted=False),
}


def renamed_knobs(owner: str, kwargs: Mapping[str, Any], *, stacklevel: int = 2) -> dict[str, Any]:
    """``kwargs`` with every old name of :data:`OLD_NAMES` replaced by its new knob(s): an accepted one warns once
    (a DeprecationWarning naming the new knob), a refused one raises ConfigError naming it; an old name and its
    new knob at once is a ConfigError. ``stacklevel`` 2: the warning points at the line that called the caller."""
    out = dict(kwargs)
    for old in [k for k in kwargs if k in OLD_NAMES]:
        entry = OLD_NAMES[old]
        if not entry.accepted:
            raise ConfigError(
                old, f"is not a knob of {owner}" + (f" ({entry.note})" if entry.note else ""), f"use {entry.new}"
            )
        value = out.pop(old)
        new = entry.new_knobs(value)
        both = sorted(set(new) & set(out)) or (sorted({"cp", "tp", "sp"} & set(out)) if entry.convert else [])
        if both:
            raise ConfigError(old, f"was given together with {both[0]}", f"pass {both[0]} only ({old} is its old name)")
        said = ", ".join(f"{k}={v!r}" for k, v in new.items()) or "nothing (alignment 1)"
        warnings.warn(
            f"{owner}: {old!r} is deprecated, use {entry.new!r} ({old}={value!r} is {said}"
            + (f"; {entry.note})" if entry.note else ")"),
            DeprecationWarning,
            stacklevel=stacklevel + 1,
        )
        out.update(new)
    return out


_F = TypeVar("_F", bound=Callable[..., Any])


def accepts_old_names(fn: _F) -> _F:
    """A function or class whose keywords are spec knobs also takes their old names (:func:`renamed_knobs`,
    the warning at the caller's line)."""
    target = fn.__init__ if isinstance(fn, type) else fn
    owner = fn.__qualname__

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **renamed_knobs(owner, kwargs))

    if isinstance(fn, type):
        fn.__init__ = wrapper
        return fn
    return wrapper  # type: ignore[return-value]


PackingSpec = accepts_old_names(PackingSpec)  # PackingSpec(width=...) warns and works (declared above the table)
