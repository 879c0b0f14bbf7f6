"""Sample types that flow between our Energon stages."""

from __future__ import annotations

from typing import Any

from megatron.energon import Sample, edataclass


@edataclass
class SkippedSample(Sample):
    """Marker for a sample that pre-encoding rejected (corrupt image, broken JSON, ...).

    Pre-encoders return it instead of raising, so the packing wrapper in the same worker can
    count the skip by reason (Energon's own ``SkipSample`` is swallowed without a trace).
    """

    reason: str
    detail: str = ""


@edataclass
class PackCandidate(Sample):
    """A pre-encoded sample waiting in a packing buffer: its packing cost and a light payload.

    The payload holds what post-encoding needs (token ids, encoded image bytes, sizes), never
    decoded pixels, so a deep buffer costs bytes, not tensors.
    """

    cost: tuple
    payload: Any


@edataclass
class PackedSamples(Sample):
    """The post-encoded members of one pack, in pack order, before batching."""

    samples: list
    packing_stats: dict | None = None


@edataclass
class EncodedSegment(Sample):
    """One post-encoded sample: its :class:`~energon_pack.thd.ThdSegment` (tokens, masks, pixels)."""

    segment: Any
