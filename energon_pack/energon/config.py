"""The packing configuration shared by our Energon task encoders, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.thd import OVERLENGTH_POLICIES, ThdLayout, alignment_multiple

PACKING_MODES = ("carry", "rounds")
#: Knobs that may change between save and restore (they do not change which packs come next).
RESUME_SAFE_KNOBS = ("skip_guard", "skip_warn_rate", "skip_warn_window")


@dataclass(frozen=True)
class PackingConfig:
    """Pack width and layout (THD), packer knobs, and optional extra budgets per pack.

    Costs are (aligned tokens[, ViT patches][, media items]); the optional budgets bound the
    vision work one pack may carry. ``overlength``: ``skip`` (counted), ``error``, or
    ``truncate`` (text only).

    ``skip_guard``: a worker that has skipped this many samples without emitting a single pack
    raises ``AllSkippedError`` naming the skip reasons and counts, instead of hanging on a
    stream where nothing can ever be packed (wrong field names, width too small, wrong
    encoder). ``None`` (default) means ``max(1000, 10 * packing_buffer_size)``. A finite stream
    that ends before the limit with 0 packs warns with the same message.

    ``skip_warn_rate`` / ``skip_warn_window``: a worker logs one warning (and a ``RuntimeWarning``)
    the first time at least ``skip_warn_rate`` of ``skip_warn_window`` consecutive samples it
    read were skipped (default: 50% of 200), with the skip reasons, their counts and one example
    per reason, so mostly-skipped data does not look healthy. ``skip_warn_rate=None`` turns it off.

    Every knob except ``skip_guard`` and the ``skip_warn_*`` knobs is stored as a fingerprint in the
    checkpoint; restoring
    with a different value raises ``ConfigError`` naming the knob.
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
    seed: int = 0
    skip_guard: int | None = None
    skip_warn_rate: float | None = 0.5
    skip_warn_window: int = 200

    def __post_init__(self) -> None:
        if self.packing_mode not in PACKING_MODES:
            raise ConfigError("packing_mode", f"unknown mode {self.packing_mode!r}", f"use one of {PACKING_MODES}")
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
        base = base or cls()
        return cls(**{**{f.name: getattr(base, f.name) for f in fields(cls)}, **overrides})

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
