"""Megatron-Core THD batch layout: alignment rules and the packed-row builder (see docs/concepts/batch_contract.md).

One packed row holds n segments (source samples) back to back. Each segment occupies its
*aligned* span (real length rounded up to the CP/SP multiple); the rest of the span is a gap
filled with the pad id, never supervised and never attended to by real tokens. With a fixed
width the last segment's span also absorbs the tail, so the row is exactly ``seq_length`` long.

``seq_length`` (Megatron's and Bridge's name) is the pack width everywhere in the public API; its
old name ``width`` is still accepted (:func:`accepts_old_width`) with a DeprecationWarning.

This module is pure torch/numpy: it must never import Megatron or Energon.
"""

from __future__ import annotations

import ctypes
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from torch.utils.data import get_worker_info

from energon_pack.errors import ConfigError
from energon_pack.packing.layout_rules import (
    KEEPING_OVERLENGTH_POLICIES,
    OVERLENGTH_MEANINGS,
    OVERLENGTH_POLICIES,
    alignment_multiple,
    check_layout_knobs,
    check_text_overlength,
    is_int,
)

IGNORE_INDEX = -100

#: Visual tensors a segment may carry; each is concatenated along dim 0 in segment order.
VISUAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")

#: Batch key of the vision preset that built a Qwen-VL row (:func:`vision_preset_record`).
VISION_PRESET_KEY = "vision_preset"
_VISION_PRESET_FIELDS = ("name", "rope_style", "tokens_per_second", "patch_size", "temporal_patch_size", "merge_size")

__all__ = [
    "IGNORE_INDEX",
    "KEEPING_OVERLENGTH_POLICIES",
    "OVERLENGTH_MEANINGS",
    "OVERLENGTH_POLICIES",
    "PADDED_BOUNDARY_KEYS",
    "VISION_PRESET_KEY",
    "VISUAL_KEYS",
    "ThdLayout",
    "ThdSegment",
    "accepts_old_width",
    "aligned_length",
    "alignment_multiple",
    "build_thd_batch",
    "check_text_overlength",
    "shifted_labels_and_loss_mask",
    "thd_attention_mask",
    "vision_preset_record",
    "without_equal_padded_boundaries",
]


def aligned_length(length: int, multiple: int) -> int:
    """``length`` rounded up to ``multiple`` (the physical span a segment occupies in a pack)."""
    return -(-length // multiple) * multiple


def shifted_labels_and_loss_mask(
    input_ids: torch.Tensor, target_mask: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token labels shifted inside one segment, and the matching float loss mask.

    ``target_mask[i]`` says token ``i`` is supervised (should be predicted). Position ``i`` then
    predicts ``input_ids[i+1]`` when ``target_mask[i+1]``; the last position never predicts
    anything, so no label crosses a segment boundary.
    """
    if input_ids.dim() != 1 or target_mask.shape != input_ids.shape:
        raise ValueError("input_ids and target_mask must be 1-D tensors of the same length")
    ids = input_ids.to(torch.int64)
    supervised_next = torch.zeros_like(ids, dtype=torch.bool)
    supervised_next[:-1] = target_mask[1:].to(torch.bool)
    labels = torch.full_like(ids, ignore_index)
    labels[:-1] = ids[1:]
    labels = torch.where(supervised_next, labels, torch.full_like(labels, ignore_index))
    return labels, supervised_next.to(torch.float32)


_F = TypeVar("_F", bound=Callable[..., Any])


def warn_old_width(owner: str, stacklevel: int = 2) -> None:
    """The DeprecationWarning for the pack width's old name ``width`` (read or passed to ``owner``)."""
    warnings.warn(
        f"{owner}: 'width' is deprecated, use 'seq_length' (the same pack width, in tokens)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def accepts_old_width(fn: _F) -> _F:
    """Let a function or class that takes ``seq_length`` also take ``width=``, the pack width's old name.

    ``fn(..., width=N)`` runs as ``fn(..., seq_length=N)`` with a DeprecationWarning at the caller's
    line, so code written against the old name keeps working; both names at once is a TypeError.
    """
    target = fn.__init__ if isinstance(fn, type) else fn
    owner = fn.__qualname__

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "width" in kwargs:
            if "seq_length" in kwargs:
                raise TypeError(f"{owner}: pass seq_length or its deprecated name width, not both")
            warn_old_width(owner)
            kwargs["seq_length"] = kwargs.pop("width")
        return target(*args, **kwargs)

    if isinstance(fn, type):
        fn.__init__ = wrapper
        return fn
    return wrapper  # type: ignore[return-value]


@accepts_old_width
@dataclass(frozen=True)
class ThdLayout:
    """How segments are laid out in one packed row; validated at construction (ConfigError naming the knob).

    ``ThdLayout.from_spec(spec, pad_token_id)`` is the layout of a packing spec's packs.

    Args:
        seq_length: the pack width in tokens: the most physical tokens one row may hold (Megatron's
            ``seq_length``). A multiple of ``pad_multiple``. Old name ``width=`` still accepted (deprecated).
        pad_multiple: every segment's span is its length rounded up to this (default 1: no alignment); use
            :func:`alignment_multiple` for context/sequence parallelism.
        pad_to_max_length: make every row exactly ``seq_length`` long (default False: rows end after the last
            segment's aligned span); Bridge needs it with expert parallelism and CUDA graphs.
        pad_cu_seqlens: give the cu_seqlens arrays the static length ``max_segments + 1`` (CUDA graphs); needs
            ``pad_to_max_length`` and ``max_segments``.
        max_segments: the most segments (samples) one row may hold; None: no limit.
        pad_token_id: the id written into alignment gaps and the tail (the tokenizer's pad id; default 0).
        ignore_index: the label of unsupervised positions (default -100, PyTorch cross-entropy's).
    """

    seq_length: int
    pad_multiple: int = 1
    pad_to_max_length: bool = False
    pad_cu_seqlens: bool = False
    max_segments: int | None = None
    pad_token_id: int = 0
    ignore_index: int = IGNORE_INDEX

    def __post_init__(self) -> None:
        check_layout_knobs(
            self.seq_length, self.pad_multiple, self.pad_to_max_length, self.pad_cu_seqlens, self.max_segments
        )
        if not is_int(self.pad_token_id) or self.pad_token_id < 0:
            raise ConfigError(
                "pad_token_id",
                f"must be a non-negative token id, got {self.pad_token_id!r}",
                "use the tokenizer's pad id (or 0 if it has none)",
            )
        if not is_int(self.ignore_index):
            raise ConfigError(
                "ignore_index",
                f"must be an integer, got {self.ignore_index!r}",
                "use -100 (the PyTorch cross-entropy default)",
            )

    @classmethod
    def from_spec(cls, spec: Any, pad_token_id: int = 0) -> ThdLayout:
        """The row layout of the packs of ``spec`` (a :class:`~energon_pack.packing.spec.PackingSpec`);
        ``pad_token_id``: the tokenizer's pad id."""
        return cls(
            seq_length=spec.seq_length,
            pad_multiple=spec.alignment,
            pad_to_max_length=spec.pad_to_max_length,
            pad_cu_seqlens=spec.pad_cu_seqlens,
            max_segments=spec.max_segments,
            pad_token_id=pad_token_id,
        )

    @property
    def width(self) -> int:
        """Deprecated name of :attr:`seq_length` (reading it warns)."""
        warn_old_width("ThdLayout.width")
        return self.seq_length

    def segment_span(self, length: int) -> int:
        """Physical tokens a segment of ``length`` real tokens costs in a pack (its aligned length)."""
        if not is_int(length) or length < 1:
            raise ValueError(f"segment length must be an integer >= 1, got {length!r}")
        return aligned_length(length, self.pad_multiple)


#: madvise(2) advice that maps every page of a range now, writable, in one call (Linux 5.14+)
_MADV_POPULATE_WRITE = 23


@functools.lru_cache(maxsize=1)
def _madvise():
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError, TypeError):  # no C library madvise here: no prefaulting
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _prefault(out: torch.Tensor) -> None:
    """Map a fresh shared-memory tensor's pages in one call before they are written, instead of one
    4 KiB page fault at a time (for a float32 pack's 90 MB: 26 ms against 37 ms). Where the kernel
    lacks the advice the call fails harmlessly and the writes fault the pages in as before."""
    madvise = _madvise()
    if madvise is not None and out.numel():
        madvise(out.data_ptr(), out.numel() * out.element_size(), _MADV_POPULATE_WRITE)


class DeferredRows(Protocol):
    """Rows that write themselves into a buffer (e.g. Qwen-VL patch rows whose layout waits for the
    pack, :class:`energon_pack.qwen_vl.vision.PendingPatchRows`): the THD builder allocates the
    pack's tensor and calls ``write_into`` with this segment's slice of it."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def write_into(self, out: torch.Tensor) -> None: ...


@dataclass
class ThdSegment:
    """One source sample, ready to pack: tokens with labels already shifted inside the segment.

    Tensors are 1-D of one length L (``mrope_position_ids`` is [3, L], starting at 0); dtypes
    are normalised on construction (int64 ids/labels/positions, float32 loss mask).
    ``visual`` holds any of :data:`VISUAL_KEYS`, rows in this segment's media order (tensors, or
    :class:`DeferredRows` that the builder writes straight into the pack's tensor).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    mrope_position_ids: torch.Tensor | None = None
    visual: dict[str, torch.Tensor | DeferredRows] | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        name = f"segment {self.key!r}" if self.key is not None else "segment"
        ids = self.input_ids
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
            raise ValueError(f"{name}: input_ids must be a 1-D tensor")
        length = ids.numel()
        if length == 0:
            raise ValueError(f"{name}: empty segment (input_ids has 0 tokens)")
        for field, tensor in (
            ("input_ids", ids),
            ("labels", self.labels),
            ("mrope_position_ids", self.mrope_position_ids),
        ):
            if tensor is not None and (tensor.is_floating_point() or tensor.is_complex()):
                raise ValueError(f"{name}: {field} must be an integer tensor, got {tensor.dtype}")
        for field, tensor in (("labels", self.labels), ("loss_mask", self.loss_mask)):
            if tuple(tensor.shape) != (length,):
                raise ValueError(
                    f"{name}: {field} has shape {tuple(tensor.shape)}, expected ({length},) like input_ids"
                )
        if self.mrope_position_ids is not None and tuple(self.mrope_position_ids.shape) != (3, length):
            raise ValueError(
                f"{name}: mrope_position_ids has shape {tuple(self.mrope_position_ids.shape)}, expected (3, {length})"
            )
        if self.visual is not None:
            unknown = sorted(set(self.visual) - set(VISUAL_KEYS))
            if unknown:
                raise ValueError(f"{name}: unknown visual keys {unknown}; expected any of {list(VISUAL_KEYS)}")
        self.input_ids = ids.to(torch.int64)
        self.labels = self.labels.to(torch.int64)
        self.loss_mask = self.loss_mask.to(torch.float32)
        if self.mrope_position_ids is not None:
            self.mrope_position_ids = self.mrope_position_ids.to(torch.int64)

    def __len__(self) -> int:
        return self.input_ids.numel()

    @classmethod
    def from_target_mask(
        cls, input_ids: torch.Tensor, target_mask: torch.Tensor, *, ignore_index: int = IGNORE_INDEX, **kw
    ) -> ThdSegment:
        """Segment from unshifted ids and a per-token "supervised" mask (see :func:`shifted_labels_and_loss_mask`)."""
        input_ids = torch.as_tensor(input_ids)
        labels, loss_mask = shifted_labels_and_loss_mask(input_ids, torch.as_tensor(target_mask), ignore_index)
        return cls(input_ids=input_ids, labels=labels, loss_mask=loss_mask, **kw)


def _static_cu(cu: list[int], size: int) -> list[int]:
    """Extend cumulative boundaries with zero-length segments (repeat the last value) to ``size`` entries."""
    return cu + [cu[-1]] * (size - len(cu))


def _cat_rows(parts: Sequence[torch.Tensor | DeferredRows]) -> torch.Tensor:
    """``torch.cat(parts)`` for tensors and :class:`DeferredRows` alike. Inside a data-loader worker
    the result is allocated in shared memory, so sending the batch to the main process does not
    copy it again (a float32 pack's pixels are about 90 MB; torch's own ``default_collate`` does
    the same for the same reason); deferred rows are then written there directly, once."""
    deferred = any(not isinstance(p, torch.Tensor) for p in parts)
    in_worker = get_worker_info() is not None
    if not deferred and (not in_worker or parts[0].device.type != "cpu"):
        return torch.cat(parts, dim=0)
    tail, dtype = tuple(parts[0].shape[1:]), parts[0].dtype
    for p in parts:
        if tuple(p.shape[1:]) != tail or p.dtype != dtype or (isinstance(p, torch.Tensor) and p.device.type != "cpu"):
            raise ValueError(
                f"visual rows of one key must share row shape, dtype and the CPU: {tail} {dtype} "
                f"vs {tuple(p.shape[1:])} {p.dtype}"
            )
    rows = sum(p.shape[0] for p in parts)
    base = torch.empty(0, dtype=dtype)
    if in_worker:
        out = base.new(base._typed_storage()._new_shared(rows * math.prod(tail), device=base.device))
        out = out.resize_(rows, *tail)
        _prefault(out)
    else:
        out = torch.empty((rows, *tail), dtype=dtype)
    start = 0
    for p in parts:
        dst = out[start : start + p.shape[0]]
        if isinstance(p, torch.Tensor):
            dst.copy_(p)
        else:
            p.write_into(dst)
        start += p.shape[0]
    return out


def _concat_visual(segments: Sequence[ThdSegment]) -> dict[str, torch.Tensor | None]:
    """Each visual key concatenated along dim 0 in segment order; None when no segment has it."""
    out: dict[str, torch.Tensor | None] = {}
    for k in VISUAL_KEYS:
        parts = [s.visual[k] for s in segments if s.visual is not None and s.visual.get(k) is not None]
        out[k] = _cat_rows(parts) if parts else None
    return out


def build_thd_batch(segments: Sequence[ThdSegment], layout: ThdLayout) -> dict:
    """Pack ``segments`` into one THD row (MBS=1) with exactly the keys of docs/concepts/batch_contract.md.

    Each segment is followed by its alignment gap (pad id, label ``ignore_index``, loss 0,
    positions continuing); with a fixed width the last segment's span absorbs the tail. Labels
    and loss mask are made consistent: the last token of each segment and every gap get
    ``ignore_index``, the loss mask is 0 wherever the label is ignored and vice versa.
    """
    if len(segments) == 0:
        raise ValueError("cannot build a THD batch from an empty segment list")
    n = len(segments)
    if layout.max_segments is not None and n > layout.max_segments:
        raise ValueError(f"{n} segments exceed max_segments={layout.max_segments}")
    with_mrope = [s.mrope_position_ids is not None for s in segments]
    if any(with_mrope) and not all(with_mrope):
        raise ValueError("mrope_position_ids must be given for all segments or none (mixed segments in one pack)")

    lengths = [len(s) for s in segments]
    spans = [layout.segment_span(length) for length in lengths]
    packed = sum(spans)
    if packed > layout.seq_length:
        raise ValueError(f"Packed sequence length {packed} exceeds width {layout.seq_length} (seq_length)")
    total = layout.seq_length if layout.pad_to_max_length else packed
    spans[-1] += total - packed  # the last segment's span absorbs the fixed-width tail

    ignore = layout.ignore_index
    input_ids = torch.full((total,), layout.pad_token_id, dtype=torch.int64)
    labels = torch.full((total,), ignore, dtype=torch.int64)
    loss_mask = torch.zeros(total, dtype=torch.float32)
    position_ids = torch.empty(total, dtype=torch.int64)
    padding_mask = torch.ones(total, dtype=torch.bool)
    mrope = torch.empty((3, total), dtype=torch.int64) if with_mrope[0] else None

    cu, cu_padded = [0], [0]
    for seg, length, span in zip(segments, lengths, spans):
        start = cu_padded[-1]
        real, gap = slice(start, start + length), slice(start + length, start + span)
        input_ids[real] = seg.input_ids
        seg_labels = seg.labels.clone()
        seg_labels[-1] = ignore  # never predict across the boundary
        seg_labels[seg.loss_mask == 0] = ignore
        labels[real] = seg_labels
        loss_mask[real] = torch.where(seg_labels == ignore, 0.0, seg.loss_mask)
        position_ids[start : start + span] = torch.arange(span)
        padding_mask[real] = False
        if mrope is not None:
            mrope[:, real] = seg.mrope_position_ids
            first_gap = int(seg.mrope_position_ids.max()) + 1
            mrope[:, gap] = torch.arange(first_gap, first_gap + span - length)
        cu.append(cu[-1] + length)
        cu_padded.append(start + span)

    max_seqlen = max(spans)
    if layout.pad_cu_seqlens:
        size = layout.max_segments + 1
        cu, cu_padded, max_seqlen = _static_cu(cu, size), _static_cu(cu_padded, size), layout.seq_length
    cu_seqlens = torch.tensor(cu, dtype=torch.int32)
    cu_seqlens_padded = torch.tensor(cu_padded, dtype=torch.int32)
    max_seqlen_t = torch.tensor(max_seqlen, dtype=torch.int32)

    return {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "loss_mask": loss_mask.unsqueeze(0),
        "position_ids": position_ids.unsqueeze(0),
        "mrope_position_ids": mrope.unsqueeze(1) if mrope is not None else None,
        # q and kv are the same tensor object, as in Megatron-Bridge (self-attention).
        "cu_seqlens_q": cu_seqlens,
        "cu_seqlens_kv": cu_seqlens,
        "cu_seqlens_q_padded": cu_seqlens_padded,
        "cu_seqlens_kv_padded": cu_seqlens_padded,
        "max_seqlen_q": max_seqlen_t,
        "max_seqlen_kv": max_seqlen_t,
        "padding_mask": padding_mask.unsqueeze(0),
        **_concat_visual(segments),
        "real_tokens": sum(lengths),
        "supervised_tokens": int(torch.count_nonzero(loss_mask)),
        "total_tokens": total,
        "num_segments": n,
        "__keys__": [s.key for s in segments],
    }


PADDED_BOUNDARY_KEYS = ("cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def without_equal_padded_boundaries(batch: dict, *, static_cu: bool) -> dict:
    """``batch`` without ``cu_seqlens_*_padded`` where every segment's physical span equals its length.

    Megatron-Bridge's own packing emits the padded boundaries only when they differ, so Transformer Engine keeps
    its faster unpadded THD path; on the static path (``pad_cu_seqlens``) they stay, as CUDA graphs need the same
    inputs every step. The dict is changed in place and returned.
    """
    padded = batch.get("cu_seqlens_q_padded")
    if not static_cu and isinstance(padded, torch.Tensor) and torch.equal(padded, batch["cu_seqlens_q"]):
        for key in PADDED_BOUNDARY_KEYS:
            batch.pop(key, None)
    return batch


def vision_preset_record(preset: object) -> dict:
    """What a batch records of the vision preset that built it (under :data:`VISION_PRESET_KEY`): its name,
    M-RoPE rule (``rope_style``, ``tokens_per_second``), patch, temporal patch and merge sizes. Plain
    str/int/float values, so the record survives Energon's batching, the DataLoader's collation, pinning
    and pickling; the HF integration checks it against the model's config."""
    return {field: getattr(preset, field) for field in _VISION_PRESET_FIELDS}


def thd_attention_mask(cu_seqlens_padded: torch.Tensor, cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Dense bool [T, T] mask (True = attend) equivalent to THD varlen causal attention.

    Real token i of segment s attends to the real tokens j <= i of s (segment s starts at
    ``cu_seqlens_padded[s]`` and has ``cu_seqlens[s+1] - cu_seqlens[s]`` real tokens). Gap
    positions attend only to themselves, so no softmax row is empty (no NaN). A CPU reference
    for checking varlen kernels and cu_seqlens; O(T^2) memory, so for tests and small T.
    """
    padded = torch.as_tensor(cu_seqlens_padded).flatten().to(torch.int64)
    logical = torch.as_tensor(cu_seqlens).flatten().to(torch.int64)
    if padded.shape != logical.shape or padded.numel() < 1:
        raise ValueError("cu_seqlens_padded and cu_seqlens must be non-empty and of the same length")
    if int(padded[-1]) > total:
        raise ValueError(f"cu_seqlens_padded ends at {int(padded[-1])}, beyond the row length {total}")
    segment_of = torch.full((total,), -1, dtype=torch.int64)  # -1 marks gaps
    for s, (start, length) in enumerate(zip(padded[:-1].tolist(), logical.diff().tolist())):
        if length > int(padded[s + 1]) - start:
            raise ValueError(f"segment {s}: {length} real tokens do not fit its physical span")
        segment_of[start : start + length] = s
    pos = torch.arange(total)
    same_segment = (segment_of[:, None] == segment_of[None, :]) & (segment_of[:, None] >= 0)
    causal = pos[None, :] <= pos[:, None]
    return (same_segment & causal) | torch.eye(total, dtype=torch.bool)
