"""The packing configuration of our Energon task encoders: the shared :class:`PackingSpec` plus the Energon-only
knobs, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.packing.spec import PackingSpec, accepts_old_names
from energon_pack.thd import ThdLayout

PACKING_MODES = ("carry", "rounds")
#: knobs only the tokens-only carry packer has (setting one, with balance unset, selects it)
TOKENS_PACKER_KNOBS = ("lookahead_packs", "min_fill", "max_age")
#: Knobs that may change between save and restore (they do not change which packs come next).
RESUME_SAFE_KNOBS = ("skip_guard", "skip_warn_rate", "skip_warn_window")


@accepts_old_names
@dataclass(frozen=True)
class PackingConfig(PackingSpec):
    """Every knob of :class:`~energon_pack.packing.spec.PackingSpec` (width, alignment, static shapes, budgets,
    ``overlength``, ``balance`` and ``cost_model``, ``seed``: documented there, once) plus the Energon-only ones.

    Every knob except ``skip_guard`` and the ``skip_warn_*`` knobs is stored as a fingerprint in the checkpoint;
    restoring with a different value raises ``ConfigError`` naming the knob (they change which packs come next; the
    others do not). Old knob names (``width`` ...) are accepted or refused by
    :data:`~energon_pack.packing.spec.OLD_NAMES`, naming the new one.

    ``balance`` here: the default rule (:func:`~energon_pack.packing.spec.default_balance`) gives ``"tokens"`` in
    rounds mode (Energon's rounds are packed by tokens) or when ``lookahead_packs``, ``min_fill`` or ``max_age`` is
    set (knobs of the tokens-only packer; with ``"compute"`` they are an error); ``"compute"`` is the
    :class:`~energon_pack.packing.balanced.ComputeBalancedPacker` holding ``packing_buffer_size`` samples (its
    measured fill cost and DP efficiency on public mixes: PackingSpec's ``balance``).

    Attributes:
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

    packing_mode: str = "carry"
    lookahead_packs: float | None = None
    min_fill: float | None = None
    max_age: int | None = None
    skip_guard: int | None = None
    skip_warn_rate: float | None = 0.5
    skip_warn_window: int = 200

    def __post_init__(self) -> None:
        if self.packing_mode not in PACKING_MODES:
            raise ConfigError("packing_mode", f"unknown mode {self.packing_mode!r}", f"use one of {PACKING_MODES}")
        super().__post_init__()  # the spec's knobs, and the default rule of balance (with _tokens_only below)
        tokens_knobs = self._tokens_knobs()
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

    def _tokens_knobs(self) -> list[str]:
        return [k for k in TOKENS_PACKER_KNOBS if getattr(self, k) is not None]

    def _tokens_only(self) -> tuple[str, ...]:
        """Energon's reasons to pack by tokens: rounds mode, or a knob of the tokens-only carry packer."""
        rounds = ("packing_mode='rounds'",) if self.packing_mode != "carry" else ()
        return rounds + tuple(self._tokens_knobs())

    def layout(self, pad_token_id: int = 0) -> ThdLayout:
        """The THD row layout of these packs (``pad_token_id``: the tokenizer's pad id)."""
        return ThdLayout.from_spec(self, pad_token_id)

    def packer_options(self) -> dict[str, Any]:
        return {
            "lookahead_packs": self.lookahead_packs,
            "min_fill": self.min_fill,
            "max_age": self.max_age,
            "on_oversize": "error" if self.overlength == "error" else "skip",
            "seed": self.seed,
        }
