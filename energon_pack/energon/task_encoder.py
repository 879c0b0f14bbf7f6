"""A task-encoder mixin that packs with our carry-over wrapper when ``packing_buffer_size`` is set.

Encoders call :meth:`CarryOverPackingMixin.configure_packing` with a :class:`PackingConfig`
and give pre-encoded samples a ``cost`` (see :class:`PackCandidate`); post-encoded samples
are :class:`EncodedSegment` and the mixin's ``batch`` builds the THD row.

Users keep Energon's surface, ``get_train_dataset(..., packing_buffer_size=K)``. With
``packing_mode="carry"`` (default) :meth:`build_batch` inserts
:class:`CarryOverPackingDataset` (open bins carried across rounds, at most K samples held
per worker); with ``packing_mode="rounds"`` Energon's own ``PackingDataset`` runs with our
first-fit-decreasing selector, the behaviour users have today, so both can be compared on
the same data.

The stream, bottom up: ``[SourceEnd -> packing layer (carry or rounds) -> PackStream -> batch]``,
and around the whole loader stream a :class:`ResumeGuard` whose state carries the resume
fingerprint (:mod:`.fingerprint`): the shards :meth:`build_train_datasets` checked, the worker
configuration, this encoder and its :meth:`resume_knobs`. Configuring an encoder installs the
Energon guards (:func:`~energon_pack.energon.compat.install_energon_guards`) and the default bounded waits on object
storage (:func:`~energon_pack.object_waits.install_default_object_waits`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import fields
from functools import partial
from typing import Any

from megatron.energon import stateless
from megatron.energon.errors import FatalSampleError
from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.task_encoder.base import get_failure_tolerance, get_stateless
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers import BatchDataset, MapDataset

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.object_waits import install_default_object_waits
from energon_pack.packing import (
    ComputeBalancedPacker,
    OnlinePacker,
    PackingStats,
    StepCostModel,
    first_fit_decreasing,
)
from energon_pack.packing.step_cost import DEFAULT_SHAPE, resolve_cost_model
from energon_pack.thd import ThdLayout, build_thd_batch

from .carry_over import CarryOverPackingDataset
from .compat import install_energon_guards
from .config import RESUME_SAFE_KNOBS, PackingConfig
from .fingerprint import ShardFacts, resume_fingerprint
from .pack_stream import PackStream
from .resume_guard import ResumeGuard
from .rounds import CountedSkip, RoundsPackingDataset
from .samples import PackedSamples, SkippedSample
from .shards import shard_facts
from .sources import SourceSkips, SourceTally
from .stream import SkipWatch, skip_guard_limit


class OverlengthError(ConfigError, FatalSampleError):
    """A sample over the pack's budgets under ``overlength="error"``: a ConfigError naming the knob, and an Energon
    ``FatalSampleError`` so that Energon's error handlers (rounds mode selects inside one) re-raise it instead of
    logging it and dropping the whole buffer."""


class CarryOverPackingMixin:
    """Mix in before an Energon ``TaskEncoder``; see the module docstring."""

    packing: PackingConfig
    layout: ThdLayout

    def configure_packing(self, config: PackingConfig, pad_token_id: int) -> None:
        """Set the packing knobs (called from the encoder's ``__init__``) and install the Energon guards."""
        if hasattr(self, "packing_fingerprint"):  # the hook's name before issue 31: its knobs would be ignored
            raise ConfigError(
                "packing_fingerprint",
                f"{type(self).__name__} overrides packing_fingerprint(), which is no longer called, so its knobs "
                "would not reach the resume fingerprint",
                "rename it to resume_knobs() returning {**super().resume_knobs(), your knobs}",
            )
        self.packing = config
        self.layout = config.layout(pad_token_id)
        install_energon_guards()
        install_default_object_waits()  # an msc:// dataset's reads are bounded unless the user chose otherwise

    def check_width_fits(self, shortest: int, what: str) -> None:
        """ConfigError("seq_length") when even the shortest possible sample (``shortest`` tokens,
        e.g. the chat template's headers around a one-token answer) cannot fit one pack."""
        span = self.layout.segment_span(shortest)
        if self.packing.seq_length < span:
            raise ConfigError(
                "seq_length",
                f"{self.packing.seq_length} is below the shortest possible sample: {what} is already "
                f"{shortest} tokens ({span} aligned), so every sample would be skipped",
                f"use seq_length >= {span}; a good width is several times your median sample, e.g. 4096 or 8192",
            )

    @property
    def packing_mode(self) -> str:
        return self.packing.packing_mode

    def packing_capacity(self) -> tuple[int, ...]:
        """Capacity of one pack in every budget (tokens first)."""
        return self.packing.capacity()

    def packing_cost(self, sample: Any) -> tuple[int, ...]:
        """Cost of one pre-encoded sample in every budget (tokens first)."""
        return tuple(sample.cost)

    def placed_cost(self, sample: Any, stats: PackingStats | None = None) -> tuple[int, ...]:
        """:meth:`packing_cost` under the ``overlength`` policy, in one place for every packer (carry by tokens or
        by compute, rounds): ``"error"`` raises naming the sample and the knob; otherwise the packer skips it. A
        sample kept by ``"fit"`` / ``"split"`` carries its adjustment counters, added to ``stats`` here (once per
        sample: restored samples keep their saved costs)."""
        adjustment = getattr(sample, "payload", None)
        if stats is not None and isinstance(adjustment, dict) and adjustment.get("adjustment"):
            stats.record_adjustment(adjustment["adjustment"])
        cost, capacity = self.packing_cost(sample), self.packing_capacity()
        if self.packing.overlength == "error" and any(c > cap for c, cap in zip(cost, capacity)):
            raise OverlengthError(
                "overlength",
                f"sample {getattr(sample, '__key__', '?')!r} needs {list(cost)} of the pack's budgets "
                f"{list(capacity)} (tokens first, aligned) and the policy is 'error'",
                "use overlength='skip' to count and skip such samples, or raise seq_length (or the budget it is over)",
            )
        return cost

    #: the step-cost shape of ``balance="compute"`` when neither ``cost_model`` nor the trained model is known
    default_cost_shape = DEFAULT_SHAPE

    def make_packer(self, buffer_size: int) -> OnlinePacker | ComputeBalancedPacker:
        if self.packing.balance == "compute":
            # the encoders expose no balance tuning: a run saved under earlier defaults resumes with its own
            return ComputeBalancedPacker(
                self.packing_capacity(),
                buffer_size=buffer_size,
                on_oversize=self.packing.packer_options()["on_oversize"],
                resume_saved_tuning=True,
            )
        return OnlinePacker(self.packing_capacity(), max_buffered=buffer_size, **self.packing.packer_options())

    @functools.cached_property
    def _resolved_cost_model(self) -> tuple[StepCostModel, str]:
        return resolve_cost_model(
            self.packing.cost_model,
            seen_model=getattr(self, "_seen_model", None),
            default_shape=self.default_cost_shape,
            road=type(self).__name__,
        )

    @property
    def step_cost_model(self) -> StepCostModel:
        """The step-cost model ``balance="compute"`` equalises: ``cost_model``, else the model seen by
        :meth:`price_model`, else the encoder's default shape (one log line says which)."""
        return self._resolved_cost_model[0]

    @property
    def cost_model_name(self) -> str:
        """The stable name of :attr:`step_cost_model` (source + coefficient hash) in stats and the fingerprint."""
        return self._resolved_cost_model[1]

    def price_model(self, model: Any) -> None:
        """Price ``model`` (e.g. Bridge's ``cfg.model``) when ``cost_model`` is None: the road saw what trains."""
        if self.packing.cost_model is None and model is not None:
            self._seen_model = model
            self.__dict__.pop("_resolved_cost_model", None)

    def packing_step_cost(self, sample: Any) -> float:
        """One pre-encoded sample's step cost: its tokens as one segment (a text sample has no vision)."""
        return self.step_cost_model.sample_cost(sample.cost[0])

    def member_step_cost(self, member: Any) -> float:
        """A pack member's step cost as the packer priced it (tokens as one segment, its media grids): the
        per-source cost share of a blend. A member not post-encoded (an epoch plan's) is its candidate's."""
        if not hasattr(member, "segment"):
            return self.packing_step_cost(member)
        segment = member.segment
        visual = segment.visual or {}
        grids = [
            [int(x) for x in grid]
            for name in ("image_grid_thw", "video_grid_thw")
            if visual.get(name) is not None
            for grid in visual[name]
        ]
        return self.step_cost_model.sample_cost(self.layout.segment_span(len(segment.input_ids)), grids)

    # ---------------------------------------------------------------- Energon's own hooks
    def select_samples_to_pack(self, samples: list[Any]) -> list[list[Any]]:
        """Rounds mode: first-fit-decreasing over this buffer; every valid sample is returned.

        Skip markers and oversize samples are counted (Energon would drop them silently). Our
        ``build_batch`` counts into the checkpointed stats of :class:`RoundsPackingDataset`;
        called from a ``PackingDataset`` a user built, it counts on this encoder.
        """
        return self.select_groups(samples, self._round_stats())

    def select_groups(self, samples: list[Any], stats: PackingStats) -> list[list[Any]]:
        valid = []
        for sample in samples:
            if isinstance(sample, SkippedSample):
                stats.record_skip(sample.reason)
            else:
                valid.append(sample)
        capacity = self.packing_capacity()
        result = first_fit_decreasing([self.placed_cost(s, stats) for s in valid], capacity, on_oversize="skip")
        if result.skipped:
            stats.record_skip("oversize", len(result.skipped))
        groups = [[valid[i] for i in group] for group in result.groups]
        for group in groups:
            stats.record_pack([self.packing_cost(s) for s in group], capacity)
        return groups

    @stateless
    def pack_selected_samples(self, samples: list[Any]) -> PackedSamples:
        # packing_stats are attached when the pack is yielded (PackStream), from checkpointed counters.
        return PackedSamples(
            __key__=",".join(s.__key__ for s in samples),
            __restore_key__=(),
            samples=list(samples),
            packing_stats=None,
        )

    def _round_stats(self) -> PackingStats:
        """Counters for a ``PackingDataset`` built outside our ``build_batch`` (kept on this encoder)."""
        if getattr(self, "_rounds_stats", None) is None:
            self._rounds_stats = PackingStats()
        return self._rounds_stats

    def count_postencode_skip(self, skip: SampleSkipped) -> None:
        """Report a post-encode skip by reason, in either mode; never returns.

        Rounds mode raises :class:`CountedSkip` (an Energon ``SkipSample`` carrying the reason,
        counted by :class:`RoundsPackingDataset`); carry mode re-raises ``skip`` (the carry-over
        wrapper counts it).
        """
        if self.packing_mode == "rounds":
            raise CountedSkip(skip.reason) from None
        raise skip

    # ---------------------------------------------------------------- the loader's stream, guarded for resume
    def build_train_datasets(
        self, *, datasets: list, worker_config: WorkerConfig, packing_buffer_size: int | None = None, **kwargs: Any
    ) -> SavableDataset:
        """Energon's train stream inside a :class:`ResumeGuard` (the shards are checked first)."""
        build = super().build_train_datasets
        return self._built_and_guarded(build, datasets, worker_config, packing_buffer_size, kwargs)

    def build_val_datasets(
        self, *, datasets: list, worker_config: WorkerConfig, packing_buffer_size: int | None = None, **kwargs: Any
    ) -> SavableDataset:
        """Energon's validation stream inside a :class:`ResumeGuard` (the shards are checked first)."""
        build = super().build_val_datasets
        return self._built_and_guarded(build, datasets, worker_config, packing_buffer_size, kwargs)

    def _built_and_guarded(
        self, build: Any, datasets: list, worker_config: WorkerConfig, packing_buffer_size: int | None, kwargs: dict
    ) -> ResumeGuard:
        shards = self._checked_shards(datasets)
        stream = build(
            datasets=datasets, worker_config=worker_config, packing_buffer_size=packing_buffer_size, **kwargs
        )
        return self._guarded(stream, worker_config, shards, packing_buffer_size)

    @staticmethod
    def _checked_shards(datasets: list) -> list[ShardFacts]:
        """One stat (remote: HEAD) per shard of every loaded dataset: the truncation check and the fingerprint."""
        return [facts for loaded in datasets for facts in shard_facts(loaded.dataset)]

    def _guarded(
        self,
        stream: SavableDataset,
        worker_config: WorkerConfig,
        shards: list[ShardFacts],
        packing_buffer_size: int | None,
    ) -> ResumeGuard:
        """The built stream, its state naming the rank, workers, shards, encoder and knobs it was saved for."""
        install_energon_guards()
        fingerprint = resume_fingerprint(worker_config, shards, self, packing_buffer_size)
        return ResumeGuard(stream, fingerprint=fingerprint, worker_config=worker_config)

    def resume_knobs(self) -> dict:
        """This encoder's part of the resume fingerprint: every knob that changes which packs come next."""
        knobs = {f.name: getattr(self.packing, f.name) for f in fields(self.packing) if f.name not in RESUME_SAFE_KNOBS}
        priced = self.packing.balance == "compute" or self.packing.cost_model is not None
        knobs["cost_model"] = self.cost_model_name if priced else None  # the resolved model's name, not the object
        return {"pad_multiple": self.layout.pad_multiple, **knobs}

    # ---------------------------------------------------------------- the hook we override
    def build_batch(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: WorkerConfig,
    ) -> SavableDataset:
        if packing_buffer_size is not None:
            if not isinstance(packing_buffer_size, int) or packing_buffer_size < 1:
                raise ConfigError(
                    "packing_buffer_size",
                    f"must be a positive int, got {packing_buffer_size!r}",
                    "pass the number of candidate samples each worker may hold, e.g. 64",
                )
            if batch_size != 1:
                raise ConfigError(
                    "batch_size",
                    f"online packing emits one THD row per micro-batch, got {batch_size}",
                    "use batch_size=1 (physical MBS 1) with packing_buffer_size",
                )
        if packing_buffer_size is None and isinstance(batch_size, int) and batch_size > 1:
            # Without packing, Energon would put batch_size samples into one THD row: rows overflow
            # the width and fail inside Energon (the samples are lost, one log line each).
            raise ConfigError(
                "batch_size",
                f"batch_size={batch_size} without packing_buffer_size would concatenate {batch_size} "
                f"samples into one THD row of at most seq_length={self.packing.seq_length} tokens",
                "pass packing_buffer_size=K (e.g. 64) with batch_size=1: every micro-batch is then one row filled "
                "by the packer; or batch_size=1 without packing for one sample per row",
            )
        if packing_buffer_size is None:
            return super().build_batch(
                dataset,
                batch_size=batch_size,
                batch_drop_last=batch_drop_last,
                packing_buffer_size=packing_buffer_size,
                worker_config=worker_config,
            )
        postencode = self.postencode_sample if self._is_overridden(self.postencode_sample) else None
        tolerance = self.__default_failure_tolerance__
        skips = SkipWatch(
            guard=skip_guard_limit(self.packing.skip_guard, packing_buffer_size),
            rate=self.packing.skip_warn_rate,
            window=self.packing.skip_warn_window,
            worker_config=worker_config,
        )
        common = dict(
            final_packer_stateless=get_stateless(self.pack_selected_samples),
            sample_encoder=postencode,
            sample_encoder_stateless=True if postencode is None else get_stateless(postencode),
            final_packer_failure_tolerance=get_failure_tolerance(self.pack_selected_samples, tolerance),
            sample_encoder_failure_tolerance=0 if postencode is None else get_failure_tolerance(postencode, tolerance),
            skips=skips,
            worker_config=worker_config,
        )
        below = dataset = SourceSkips(
            dataset,
            capacity=self.packing_capacity(),
            counts_oversize=self.packing.overlength != "error",
            worker_config=worker_config,
        )
        if self.packing_mode == "rounds":
            dataset = RoundsPackingDataset(
                dataset,
                buffer_size=packing_buffer_size,
                encoder=self,
                pre_packer_failure_tolerance=get_failure_tolerance(self.select_samples_to_pack, tolerance),
                **common,
            )
        else:
            carry = dataset = CarryOverPackingDataset(
                dataset,
                make_packer=partial(self.make_packer, packing_buffer_size),
                cost_fn=lambda sample: self.placed_cost(sample, carry.stats),  # counted in the packer's stats
                step_cost_fn=self.packing_step_cost if self.packing.balance == "compute" else None,
                final_packer=self.pack_selected_samples,
                **common,
            )
        layer = dataset
        below.stats = lambda: layer.stats  # per-source counts live in the packing layer's checkpointed stats
        priced = self.packing.balance == "compute" or self.packing.cost_model is not None
        step_cost = self.member_step_cost if priced else None
        dataset = SourceTally(layer, span=self.layout.segment_span, step_cost=step_cost, worker_config=worker_config)
        dataset = PackStream(dataset, worker_config=worker_config)
        # Batching as Energon does it, minus its PackingDataset and postencode map (done above).
        dataset = BatchDataset(
            dataset,
            batch_size=1,
            batcher=self.batch,
            batcher_stateless=get_stateless(self.batch),
            drop_last=batch_drop_last,
            worker_config=worker_config,
            failure_tolerance=get_failure_tolerance(self.batch, self.__default_failure_tolerance__),
        )
        if self._is_overridden(self.encode_batch):
            dataset = MapDataset(
                dataset,
                self.encode_batch,
                worker_config=worker_config,
                stateless_map_fn=get_stateless(self.encode_batch),
                failure_tolerance=get_failure_tolerance(self.encode_batch, self.__default_failure_tolerance__),
            )
        return dataset

    @stateless
    def batch(self, samples: list[Any]) -> dict:
        """One THD row (docs/concepts/batch_contract.md) from the members of the micro-batch's pack(s)."""
        members = pack_members(samples)
        batch = build_thd_batch([m.segment for m in members], self.layout)
        stats = [s.packing_stats for s in samples if getattr(s, "packing_stats", None) is not None]
        batch["packing_stats"] = stats[-1] if stats else None
        if stats and self.packing.balance == "compute":
            batch["packing_stats"] = {**stats[-1], "cost_model": self.cost_model_name}
        batch["__key__"] = ",".join(m.__key__ for m in members)
        batch["__restore_key__"] = ()
        return batch

    @stateless
    def encode_batch(self, batch: dict) -> dict:
        return batch


def pack_members(items: Sequence[Any]) -> list:
    """The post-encoded samples of a micro-batch: members of packs, or the samples themselves."""
    out = []
    for item in items:
        out.extend(item.samples if isinstance(item, PackedSamples) else [item])
    return out
