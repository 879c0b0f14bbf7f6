"""The packing layer's layout rules, free of torch: the ``overlength`` policies, the CP/TP/SP alignment multiple
and the knob rules of one packed row. The THD layer (:mod:`energon_pack.thd`) builds rows by them and re-exports
them; the packing spec (:mod:`.spec`) validates with them without importing torch."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError

#: What each ``overlength`` policy does with a sample over the pack's budgets (longer than the width, or over a
#: patch budget); the keys are the accepted values, "skip" the default.
OVERLENGTH_MEANINGS = {
    "skip": "count it as an 'oversize' skip and go on",
    "truncate": "keep its first seq_length tokens (text roads only: cutting would split visual blocks)",
    "error": "raise naming the sample and the knob",
    "fit": "Qwen-VL: lower that sample's image pixels and video frame sizes (a pixel budget shared by its media, "
    "qwen-vl-utils' total_pixels rule), then its video frames, until it fits; text alone over the width is an "
    "'oversize_text' skip; counted as 'fitted' adjustments with pixels before/after",
    "split": "Qwen-VL: cut a multi-turn conversation at user turns into pieces that fit, each with the media its "
    "turns reference and the system prompt repeated, every supervised token trained once; a turn alone over the "
    "width is fitted (media) or an 'oversize_text' skip; counted as 'split' adjustments with their pieces",
}
OVERLENGTH_POLICIES = tuple(OVERLENGTH_MEANINGS)
#: The policies that keep a multimodal sample by changing it (the Qwen-VL encoders' only; text roads refuse them).
KEEPING_OVERLENGTH_POLICIES = ("fit", "split")


def check_text_overlength(policy: str, road: str) -> str:
    """``policy`` for a text-only road; ConfigError naming ``overlength`` for an unknown one or for "fit" /
    "split" (they lower media or cut a multimodal conversation: the Qwen-VL encoders' policies)."""
    text_policies = tuple(p for p in OVERLENGTH_POLICIES if p not in KEEPING_OVERLENGTH_POLICIES)
    if policy in KEEPING_OVERLENGTH_POLICIES:
        raise ConfigError(
            "overlength",
            f"{policy!r} is a Qwen-VL policy ({OVERLENGTH_MEANINGS[policy]}); {road} packs text records",
            f"use one of {text_policies} ('truncate' keeps a long record's first seq_length tokens)",
        )
    if policy not in OVERLENGTH_POLICIES:
        raise ConfigError("overlength", f"unknown policy {policy!r}", f"use one of {text_policies}")
    return policy


def alignment_multiple(cp: int = 1, tp: int = 1, sp: bool = False, eval_cp: int | None = None) -> int:
    """Per-segment length multiple for context/sequence parallelism (Megatron-Bridge's lcm rule).

    ``lcm`` over ``cp`` in {train cp, eval cp} of ``2*cp if cp > 1 else 1`` and
    ``cp*tp if sp and tp > 1 else 1``: TP1/CP1 -> 1, TP4/SP -> 4, CP2/TP4/SP -> 8.
    """
    for knob, value in (("cp", cp), ("tp", tp), ("eval_cp", eval_cp)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(
                knob, f"must be an integer >= 1, got {value!r}", f"set {knob} to the parallel size (1 = off)"
            )
    multiple = 1
    for c in {cp} | ({eval_cp} if eval_cp is not None else set()):
        cp_multiple = 2 * c if c > 1 else 1
        sp_multiple = c * tp if sp and tp > 1 else 1
        multiple = math.lcm(multiple, cp_multiple, sp_multiple)
    return multiple


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_layout_knobs(
    seq_length: Any, pad_multiple: Any, pad_to_max_length: bool, pad_cu_seqlens: bool, max_segments: Any
) -> None:
    """The rules of one packed row's layout (``ThdLayout`` and the packing spec check them): ConfigError naming
    the knob."""
    if not is_int(seq_length) or seq_length < 1:
        raise ConfigError(
            "seq_length",
            f"must be an integer >= 1, got {seq_length!r}",
            "set seq_length to the packed row length, e.g. 4096",
        )
    if not is_int(pad_multiple) or pad_multiple < 1:
        raise ConfigError(
            "pad_multiple",
            f"must be an integer >= 1, got {pad_multiple!r}",
            "use alignment_multiple(cp, tp, sp); 1 disables alignment",
        )
    if seq_length % pad_multiple:
        lower = seq_length // pad_multiple * pad_multiple
        raise ConfigError(
            "seq_length",
            f"{seq_length} is not divisible by pad_multiple {pad_multiple}",
            f"use a multiple of {pad_multiple} for seq_length (e.g. {lower or pad_multiple} or {lower + pad_multiple})",
        )
    if max_segments is not None and (not is_int(max_segments) or max_segments < 1):
        raise ConfigError(
            "max_segments",
            f"must be an integer >= 1 or None, got {max_segments!r}",
            "set max_segments to the most samples one pack may hold",
        )
    if pad_cu_seqlens and not pad_to_max_length:
        raise ConfigError(
            "pad_cu_seqlens",
            "static cu_seqlens require a fixed width",
            "set pad_to_max_length=True (or pad_cu_seqlens=False)",
        )
    if pad_cu_seqlens and max_segments is None:
        raise ConfigError(
            "pad_cu_seqlens",
            "static cu_seqlens need a fixed segment count",
            "set max_segments (cu arrays get max_segments + 1 entries)",
        )
