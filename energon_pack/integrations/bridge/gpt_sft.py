"""Megatron-Bridge's GPT-SFT road: GPT-SFT JSONL packs for Bridge's GPT step, and the GPT-SFT configuration check.

The batch form (:func:`~.batch.to_gpt_batch`) is :mod:`.batch`'s, the rules Bridge imposes :mod:`.rules`' (shared
with the VLM road).

:func:`make_bridge_sft_dataset_provider` is a ``ConfigContainer.dataset`` whose train split is a
map-style dataset of *packs*: item ``i`` is the i-th pack of the token-budget plan
(:class:`~energon_pack.sft.TokenBudgetBatchSampler`, epochs back to back, each with its own seeded
order). Bridge's own samplers (``dataloader_type`` "single" or "cyclic") deal the pack indices to
the data-parallel ranks, so one Bridge "sample" is one pack and ``consumed_train_samples`` (what
Bridge checkpoints) resumes the stream exactly with no extra state ("cyclic" builds one epoch,
whose packs Bridge's sampler reorders each epoch). With
``train.micro_batch_size`` k > 1 the collate lays the k packs' samples out as one THD row (Bridge's
in-batch packing shape: one row per micro-batch, up to k times ``seq_length``).

:func:`check_gpt_sft_config` holds the packing rules of the GPT-SFT routes (this in-batch one and
offline packs) as one function of plain values, so an offline packer can call it with the
packing-metadata dict it wrote; :func:`check_bridge_sft_config` reads them from a Bridge config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError, raise_config_errors
from ...packing.spec import DEFAULTS, PackingSpec, renamed_knobs
from ...packing.step_cost import DEFAULT_MARK, resolve_cost_model
from ...sft import PADDING_INDEX, InBatchPacker, JsonlSFTDataset, TokenBudgetBatchSampler
from ...thd import ThdLayout, alignment_multiple
from .batch import to_gpt_batch
from .mtp import gpt_sft_mtp_error
from .provider import provider_class
from .rules import forward_step_error, get, rule_errors, topology, topology_errors, uses_cuda_graphs

__all__ = [
    "PACK_TOPOLOGY_KEYS",
    "SFTPackDataset",
    "build_sft_pack_dataset",
    "check_bridge_sft_config",
    "check_gpt_sft_config",
    "make_bridge_sft_dataset_provider",
    "pack_topology_record",
]

#: Keys a packing-metadata entry records so a later config can be compared with what the packs were built for.
PACK_TOPOLOGY_KEYS = (
    "packed_sequence_size",
    "pad_seq_to_mult",
    "context_parallel_size",
    "tensor_model_parallel_size",
    "sequence_parallel",
)
DATALOADER_TYPES = ("single", "cyclic")
ROUTES = ("in_batch", "offline")


# ---------------------------------------------------------------------------------- the pack dataset
class SFTPackDataset:
    """Map-style dataset of packs for Bridge's samplers: item ``i`` is the sample list of pack ``i``.

    Packs are the token-budget plan of ``sampler`` (built with one replica: Bridge deals the
    indices to ranks), epoch after epoch until ``num_samples`` packs exist (at least one epoch).
    A negative index (Bridge's padding of a last global batch) is one padding sample, zero loss.
    ``collate_fn`` turns a micro-batch of packs into one GPT-step batch.

    Args:
        dataset: the GPT-SFT JSONL dataset the packs index into.
        sampler: its one-replica :class:`TokenBudgetBatchSampler` (the plan; its ``seq_length`` and
            ``pad_multiple`` must equal the layout's).
        layout: the :class:`ThdLayout` of one pack (scaled by the micro-batch size in :meth:`packer`).
        num_samples: packs Bridge asks for (its train/valid samples); epochs are added until there are as many,
            at least one (default 0: one epoch).
    """

    def __init__(
        self, dataset: JsonlSFTDataset, sampler: TokenBudgetBatchSampler, layout: ThdLayout, num_samples: int = 0
    ) -> None:
        if sampler.num_replicas != 1:
            raise ConfigError(
                "sampler",
                "must plan for one replica: Bridge's sampler deals packs to the ranks",
                "build TokenBudgetBatchSampler(..., num_replicas=1, rank=0)",
            )
        if layout.seq_length != sampler.seq_length or layout.pad_multiple != sampler.pad_multiple:
            raise ConfigError(
                "layout",
                f"seq_length/pad_multiple {layout.seq_length}/{layout.pad_multiple} differ "
                f"from the sampler's {sampler.seq_length}/{sampler.pad_multiple}",
                "build both with the same values",
            )
        self.dataset, self.sampler, self.layout = dataset, sampler, layout
        self._flat: list[np.ndarray] = []  # per epoch: the samples of its packs back to back
        self._offsets: list[np.ndarray] = []  # per epoch: where each pack starts in _flat (plus the end)
        self._first = [0]  # global index of each epoch's first pack (plus the end)
        while self._first[-1] < max(int(num_samples), 1):
            self._add_epoch()
        self._packers: dict[int, InBatchPacker] = {}

    def _add_epoch(self) -> None:
        plan = self.sampler.plan(len(self._flat))
        if not plan:
            raise ConfigError("dataset", "the plan has no pack", "check the dataset's skips (energon-pack inspect)")
        self._flat.append(np.fromiter((i for pack in plan for i in pack), dtype=np.int64))
        self._offsets.append(np.cumsum([0] + [len(p) for p in plan], dtype=np.int64))
        self._first.append(self._first[-1] + len(plan))

    @property
    def epochs(self) -> int:
        """Epochs of the plan this dataset spans."""
        return len(self._flat)

    def __len__(self) -> int:
        return self._first[-1]

    def pack_indices(self, i: int) -> list[int]:
        """Dataset line indices of pack ``i`` (``[PADDING_INDEX]`` for a negative ``i``)."""
        i = int(i)
        if i < 0:
            return [PADDING_INDEX]
        if i >= len(self):
            raise IndexError(f"pack {i} out of range for {len(self)} packs")
        epoch = int(np.searchsorted(self._first, i, side="right")) - 1
        j = i - self._first[epoch]
        start, stop = self._offsets[epoch][j], self._offsets[epoch][j + 1]
        return self._flat[epoch][start:stop].tolist()

    def __getitem__(self, i: int) -> list:
        return [self.dataset[k] for k in self.pack_indices(i)]

    def packer(self, packs: int) -> InBatchPacker:
        """The collate for ``packs`` packs in one row (seq_length and segment budget scaled by ``packs``)."""
        if packs not in self._packers:
            scaled = self.layout.max_segments and self.layout.max_segments * packs
            layout = dataclasses.replace(self.layout, seq_length=self.layout.seq_length * packs, max_segments=scaled)
            self._packers[packs] = InBatchPacker(layout, sampler=self.sampler)
        return self._packers[packs]

    def collate_fn(self, items: Sequence[list]) -> dict:
        """A micro-batch of packs (Bridge's sampler: ``micro_batch_size`` of them) -> one GPT-step THD row."""
        batch = self.packer(len(items))([s for pack in items for s in pack])
        return to_gpt_batch(batch, static_cu=self.layout.pad_cu_seqlens)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_packers": {}}


def build_sft_pack_dataset(
    path: str,
    tokenizer: Any,
    spec: PackingSpec | None = None,
    *,
    format: str = "prompt_completion",
    num_samples: int = 0,
    shuffle: bool = True,
    window: int = 4096,
    cache_dir: str | None = None,
    format_kw: Mapping | None = None,
    **knobs: Any,
) -> SFTPackDataset:
    """One packing spec -> JsonlSFTDataset + one-replica TokenBudgetBatchSampler + layout -> :class:`SFTPackDataset`.

    Args:
        path: the GPT-SFT JSONL file.
        tokenizer: what :class:`JsonlSFTDataset` takes (a tokenizer object, ``"demo"``, a Qwen-VL name).
        spec: the packing knobs (:class:`~energon_pack.packing.spec.PackingSpec`: ``seq_length``, ``cp``/``tp``/``sp``
            /``eval_cp``, ``pad_to_max_length``, ``pad_cu_seqlens``, ``max_segments``, ``overlength``, ``balance``,
            ``cost_model``, ``seed``, each documented there); ``knobs`` override it by name (old names such as
            ``pad_seq_to_mult`` through the spec's table). Default None: the spec's defaults.
        format: ``"prompt_completion"`` or ``"chat"``; ``format_kw`` its options (field names, loss, ...).
        num_samples: packs to plan for (epochs back to back, at least one).
        shuffle, window: the sampler's order and packing window.
        cache_dir: where the line index and length caches go; None: the user cache dir.
    """
    spec = PackingSpec.build(spec, **knobs)
    ds = JsonlSFTDataset(
        path,
        tokenizer,
        format,
        max_length=spec.seq_length,
        overlength=spec.overlength,
        cache_dir=cache_dir,
        **dict(format_kw or {}),
    )
    sampler = TokenBudgetBatchSampler.from_spec(ds, spec, window=window, shuffle=shuffle)
    return SFTPackDataset(ds, sampler, ThdLayout.from_spec(spec, pad_token_id=ds.pad_token_id), num_samples)


# ---------------------------------------------------------------------------------- the check
def pack_topology_record(
    *,
    packed_sequence_size: int,
    context_parallel_size: int = DEFAULTS["cp"],
    tensor_model_parallel_size: int = DEFAULTS["tp"],
    sequence_parallel: bool = DEFAULTS["sp"],
) -> dict:
    """What packs record of the topology they were built for (:data:`PACK_TOPOLOGY_KEYS`).

    Args:
        packed_sequence_size: the pack width in tokens (Bridge's ``PackedSequenceSpecs`` name for ``seq_length``).
        context_parallel_size, tensor_model_parallel_size, sequence_parallel: the topology (Bridge's names of the
            spec's ``cp``/``tp``/``sp``, with their defaults: no parallelism), which sets the alignment
            ``pad_seq_to_mult``.
    """
    return {
        "packed_sequence_size": int(packed_sequence_size),
        "pad_seq_to_mult": alignment_multiple(context_parallel_size, tensor_model_parallel_size, sequence_parallel),
        "context_parallel_size": int(context_parallel_size),
        "tensor_model_parallel_size": int(tensor_model_parallel_size),
        "sequence_parallel": bool(sequence_parallel),
    }


def _recorded_topology(metadata: Any) -> dict:
    """The :data:`PACK_TOPOLOGY_KEYS` a packing-metadata dict, or Bridge's list of per-split dicts,
    records: flat (:func:`pack_topology_record`), Bridge's ``pack_size``, or ``pack-offline``'s
    ``energon_pack`` entry (``seq_length``, ``pad_seq_to_mult``, ``topology`` cp/tp/sp)."""
    found: dict = {}
    for entry in metadata if isinstance(metadata, (list, tuple)) else [metadata]:
        if not isinstance(entry, Mapping):
            continue
        ours = entry.get("energon_pack") if isinstance(entry.get("energon_pack"), Mapping) else {}
        topology = ours.get("topology") if isinstance(ours.get("topology"), Mapping) else {}
        for key, value in (
            ("packed_sequence_size", entry.get("pack_size")),
            ("packed_sequence_size", ours.get("seq_length")),
            ("pad_seq_to_mult", ours.get("pad_seq_to_mult")),
            ("context_parallel_size", topology.get("cp")),
            ("tensor_model_parallel_size", topology.get("tp")),
            ("sequence_parallel", topology.get("sp")),
        ):
            if value is not None:
                found[key] = value
        found.update({k: entry[k] for k in PACK_TOPOLOGY_KEYS if k in entry})
    return found


def check_gpt_sft_config(
    *,
    route: str,
    micro_batch_size: int,
    global_batch_size: int,
    data_parallel_size: int,
    model_seq_length: int,
    dataset_seq_length: int,
    packed_sequence_size: int | None = None,
    context_parallel_size: int = DEFAULTS["cp"],
    tensor_model_parallel_size: int = DEFAULTS["tp"],
    sequence_parallel: bool = DEFAULTS["sp"],
    pad_seq_to_mult: int | None = None,
    pad_to_max_length: bool = DEFAULTS["pad_to_max_length"],
    pad_cu_seqlens: bool = DEFAULTS["pad_cu_seqlens"],
    cuda_graphs: bool = False,
    max_segments: int | None = DEFAULTS["max_segments"],
    packing_metadata: Any = None,
) -> None:
    """The GPT-SFT packing rules; raises one :class:`ConfigError` naming every wrong knob.

    ``route``: ``"in_batch"`` (our lazy JSONL provider) or ``"offline"`` (packs on disk, with
    ``packing_metadata`` the dict or Bridge-style list it recorded). Rules: MBS 1 for offline packs;
    ``global_batch_size`` a multiple of ``micro_batch_size * data_parallel_size`` (so GBS >= DP);
    ``model_seq_length == dataset_seq_length == packed_sequence_size``; ``pad_seq_to_mult`` a
    multiple of ``lcm(2*CP if CP > 1, CP*TP if SP and TP > 1)`` (the lcm itself by default), the width
    a multiple of that lcm; ``pad_cu_seqlens``
    needs ``pad_to_max_length`` and (offline) the metadata or (in-batch) ``max_segments``; CUDA
    graphs need all of them; and metadata recording another topology means re-packing into a
    fresh output root.

    Args:
        route: ``"in_batch"`` or ``"offline"`` (above).
        micro_batch_size, global_batch_size, data_parallel_size: Bridge's ``train`` sizes and the DP size.
        model_seq_length, dataset_seq_length: ``model.seq_length`` and ``dataset.seq_length`` (the pack width).
        packed_sequence_size: Bridge's ``PackedSequenceSpecs`` width of offline packs; None: not set.
        context_parallel_size, tensor_model_parallel_size, sequence_parallel: the topology (Bridge's names of the
            spec's ``cp``/``tp``/``sp``, with their defaults: none).
        pad_seq_to_mult: the segment alignment in use; None: the topology's lcm.
        pad_to_max_length, pad_cu_seqlens, cuda_graphs: fixed-width rows, static cu_seqlens, CUDA graphs.
        max_segments: the most samples per pack (in-batch static cu_seqlens); None: no limit.
        packing_metadata: what the offline packer recorded (a dict, or Bridge's per-split list); None: none.
    """
    if route not in ROUTES:
        raise ConfigError("route", f"unknown route {route!r}", f"use one of {ROUTES}")
    errors: list[ConfigError] = []

    def bad(knob: str, problem: str, fix: str) -> None:
        errors.append(ConfigError(knob, problem, fix))

    for knob, value in (
        ("train.micro_batch_size", micro_batch_size),
        ("train.global_batch_size", global_batch_size),
        ("data_parallel_size", data_parallel_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(knob, f"must be an int >= 1, got {value!r}", f"set {knob} to a positive integer")
    mbs, gbs, dp = micro_batch_size, global_batch_size, data_parallel_size
    if route == "offline" and mbs != 1:
        bad(
            "train.micro_batch_size",
            f"is {mbs}; an offline pack is one micro-batch",
            f"set train.micro_batch_size=1 and global_batch_size={gbs // max(mbs, 1)} (in packs)",
        )
    if gbs < dp or gbs % (mbs * dp):
        bad(
            "train.global_batch_size",
            f"is {gbs}; it must be a positive multiple of micro_batch_size x data_parallel_size = {mbs} x {dp}",
            f"set train.global_batch_size to a multiple of {mbs * dp}",
        )
    if model_seq_length != dataset_seq_length:
        bad(
            "model.seq_length",
            f"is {model_seq_length} but dataset.seq_length is {dataset_seq_length}",
            f"set both to the pack width ({dataset_seq_length})",
        )
    if packed_sequence_size is not None and packed_sequence_size != dataset_seq_length:
        bad(
            "packed_sequence_size",
            f"is {packed_sequence_size} but dataset.seq_length is {dataset_seq_length}",
            f"pack with packed_sequence_size={dataset_seq_length} into a fresh output root",
        )
    cp, tp, sp = context_parallel_size, tensor_model_parallel_size, bool(sequence_parallel)
    want = alignment_multiple(cp, tp, sp)
    if pad_seq_to_mult is not None and (pad_seq_to_mult < 1 or pad_seq_to_mult % want):
        bad(
            "pad_seq_to_mult",
            f"is {pad_seq_to_mult}; CP={cp}, TP={tp}, SP={sp} need a multiple of lcm(2*CP if "
            f"CP > 1, CP*TP if SP and TP > 1) = {want}",
            f"set pad_seq_to_mult={want} and re-pack into a fresh output root",
        )
    mult = (
        pad_seq_to_mult if pad_seq_to_mult is not None and pad_seq_to_mult >= 1 and not pad_seq_to_mult % want else want
    )
    if dataset_seq_length % mult:
        bad(
            "dataset.seq_length",
            f"{dataset_seq_length} is not divisible by the alignment {mult}",
            f"use a multiple of {mult}",
        )
    static_cu = "a packing-metadata JSON" if route == "offline" else "max_segments"
    has_static_cu = packing_metadata is not None if route == "offline" else max_segments is not None
    if (cuda_graphs or pad_cu_seqlens) and not pad_to_max_length:
        bad(
            "pad_to_max_length",
            "is False; " + ("CUDA graphs need" if cuda_graphs else "pad_cu_seqlens needs") + " a fixed width",
            "set pad_to_max_length=True",
        )
    if cuda_graphs and not pad_cu_seqlens:
        bad("pad_cu_seqlens", "is False; CUDA graphs need static cu_seqlens shapes", "set pad_cu_seqlens=True")
    if (cuda_graphs or pad_cu_seqlens) and not has_static_cu:
        bad(
            "packing_metadata" if route == "offline" else "max_segments",
            f"is missing; static cu_seqlens are sized from {static_cu}",
            "write the packing-metadata JSON beside the packs" if route == "offline" else "set max_segments",
        )
    recorded = _recorded_topology(packing_metadata) if packing_metadata is not None else {}
    current = pack_topology_record(
        packed_sequence_size=dataset_seq_length,
        context_parallel_size=cp,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
    )
    if pad_seq_to_mult is not None:
        current["pad_seq_to_mult"] = pad_seq_to_mult  # the runtime must pad as the packs were padded
    changed = [
        f"{k} {recorded[k]!r} -> {current[k]!r}"
        for k in PACK_TOPOLOGY_KEYS
        if k in recorded and recorded[k] != current[k]
    ]
    if changed:
        bad(
            "packing_metadata",
            "the packs were built for another configuration (" + ", ".join(changed) + ")",
            "re-pack for the current settings into a fresh output root",
        )
    raise_config_errors(errors)


def check_bridge_sft_config(
    cfg: Any, *, data_parallel_size: int | None = None, forward_step_func: Callable | None = None
) -> None:
    """Check a Bridge ``ConfigContainer`` whose ``dataset`` is :func:`make_bridge_sft_dataset_provider`'s.

    :func:`check_gpt_sft_config` (route ``"in_batch"``) over the config's values, plus what the
    provider route needs: ``dataset.dataloader_type`` "single" or "cyclic" (Bridge's samplers deal
    the packs; "batch" collates whole global batches); per-token loss and
    ``ddp.average_in_collective=False`` (packs hold different numbers of supervised tokens);
    ``dataset.enable_in_batch_packing`` only with micro-batch size > 1 (Bridge's rule) and required
    with pipeline parallelism (else Bridge gives middle stages no cu_seqlens); CP/TP/SP equal to
    the provider's; ``forward_step_func`` Bridge's ``gpt_step.forward_step``; no MTP (that step does not
    pass ``loss_mask`` to the model, so the MTP loss would cover prompts and padding).

    Args:
        cfg: the Bridge ``ConfigContainer`` (its ``dataset``, ``model``, ``train``, ``ddp`` ... sections).
        data_parallel_size: the DP size; None: ``cfg.data_parallel_size`` (Bridge sets it in ``validate``),
            else 1.
        forward_step_func: the step the training will run; None: not checked.
    """
    ds = cfg.dataset
    if not all(hasattr(ds, k) for k in ("seq_length", "cp", "enable_in_batch_packing", "max_segments")):
        raise TypeError(
            f"cfg.dataset is a {type(ds).__name__}, not make_bridge_sft_dataset_provider's provider "
            "(for offline packs call check_gpt_sft_config(route='offline', ...))"
        )
    t = topology(cfg)
    errors = topology_errors(
        cfg,
        {"cp": ds.cp, "tp": ds.tp, "sp": ds.sp, "eval_cp": ds.eval_cp},
        packer="the dataset",
        fix=lambda name, value: f"set dataset.{name}={value!r}",
    )
    mbs = get(cfg, "train.micro_batch_size", 1)
    dp = data_parallel_size or get(cfg, "data_parallel_size") or 1
    if ds.dataloader_type not in DATALOADER_TYPES:
        errors.append(
            ConfigError(
                "dataset.dataloader_type",
                f"is {ds.dataloader_type!r}; Bridge's sampler must deal one pack per sample",
                f"use one of {DATALOADER_TYPES}",
            )
        )
    errors.extend(rule_errors(cfg, "gpt_sft"))
    pp = get(cfg, "model.pipeline_model_parallel_size", 1) or 1
    if ds.enable_in_batch_packing and mbs == 1:
        errors.append(
            ConfigError(
                "dataset.enable_in_batch_packing",
                "is True with micro_batch_size 1 (Bridge's validate refuses it)",
                "set it False, or train.micro_batch_size > 1",
            )
        )
    if pp > 1 and not ds.enable_in_batch_packing:
        errors.append(
            ConfigError(
                "dataset.enable_in_batch_packing",
                f"is False with pipeline parallel size {pp}; Bridge then sends middle pipeline stages no cu_seqlens",
                "set dataset.enable_in_batch_packing=True and train.micro_batch_size > 1",
            )
        )
    mtp = get(cfg, "model.mtp_num_layers", None) or 0
    if mtp > 0:
        errors.append(gpt_sft_mtp_error(mtp))
    step = forward_step_error(forward_step_func, "gpt_sft")
    if step is not None:
        errors.append(step)
    try:
        check_gpt_sft_config(
            route="in_batch",
            micro_batch_size=mbs,
            global_batch_size=get(cfg, "train.global_batch_size", mbs * dp),
            data_parallel_size=dp,
            model_seq_length=get(cfg, "model.seq_length"),
            dataset_seq_length=ds.seq_length,
            context_parallel_size=t["cp"],
            tensor_model_parallel_size=t["tp"],
            sequence_parallel=t["sp"],
            pad_to_max_length=ds.pad_to_max_length,
            pad_cu_seqlens=ds.pad_cu_seqlens,
            cuda_graphs=uses_cuda_graphs(cfg),
            max_segments=ds.max_segments,
        )
    except ConfigError as err:
        errors.extend(getattr(err, "errors", [err]))
    raise_config_errors(errors)
    model = get(cfg, "model")
    if getattr(ds, "cost_model", None) is None and model is not None and getattr(ds, "balance", None) != "tokens":
        # cost_model None: balance prices cfg.model, the model that trains (resolved once; the provider keeps it)
        priced, name = resolve_cost_model(seen_model=model, road="cfg.model")
        if not name.endswith(DEFAULT_MARK):  # a model it could not read leaves the sampler's default rule
            object.__setattr__(ds, "_priced_model", priced)


# ---------------------------------------------------------------------------------- the provider
#: the packing spec's knobs the GPT-SFT provider holds as fields (spec names and defaults, validated by the spec)
SFT_SPEC_KNOBS = (
    "seq_length",
    "cp",
    "tp",
    "sp",
    "eval_cp",
    "pad_to_max_length",
    "pad_cu_seqlens",
    "max_segments",
    "overlength",
    "balance",
    "cost_model",
    "seed",
)


def _sft_fields() -> list:
    field = dataclasses.field
    spec = {f.name: f for f in dataclasses.fields(PackingSpec)}
    return [
        ("path", str, field(default="")),
        ("tokenizer", Any, field(default=None)),
        ("format", str, field(default="prompt_completion")),
        ("format_kw", dict, field(default_factory=dict)),
        ("valid_path", str | None, field(default=None)),
        *((k, spec[k].type, field(default=spec[k].default)) for k in SFT_SPEC_KNOBS),
        ("enable_in_batch_packing", bool, field(default=False)),
        ("shuffle", bool, field(default=True)),
        ("window", int, field(default=4096)),
        ("cache_dir", str | None, field(default=None)),
    ]


def _provider_spec(provider: Any) -> PackingSpec:
    """The provider's packing spec; ``cost_model`` None: ``cfg.model`` as :func:`check_bridge_sft_config` priced it."""
    knobs = {k: getattr(provider, k) for k in SFT_SPEC_KNOBS}
    if knobs["cost_model"] is None:
        knobs["cost_model"] = getattr(provider, "_priced_model", None)
    return PackingSpec(**knobs)


def _build_sft_datasets(self, context: Any) -> tuple:
    """Bridge's provider hook: (train, valid, None) pack datasets, sized to the samples Bridge asks for."""
    if not self.path or self.tokenizer is None:
        raise ConfigError(
            "dataset", "the provider needs path and tokenizer", "pass both to make_bridge_sft_dataset_provider"
        )
    kw = dict(
        spec=_provider_spec(self),
        format=self.format,
        format_kw=self.format_kw,
        shuffle=self.shuffle,
        window=self.window,
        cache_dir=self.cache_dir,
    )
    cyclic = self.dataloader_type == "cyclic"  # Bridge's cyclic sampler reshuffles the one epoch's packs itself
    train = build_sft_pack_dataset(self.path, self.tokenizer, num_samples=0 if cyclic else context.train_samples, **kw)
    valid = None
    if self.valid_path and context.valid_samples > 0:
        valid = build_sft_pack_dataset(
            self.valid_path,
            self.tokenizer,
            num_samples=0 if cyclic else context.valid_samples,
            **{**kw, "shuffle": False},
        )
    return train, valid, None


def _provider_class() -> type:
    """The GPT-SFT provider class (:func:`.provider.provider_class`)."""
    return provider_class(
        "EnergonPackSFTDatasetProvider",
        __name__,
        _sft_fields() + [("dataloader_type", str | None, dataclasses.field(default="single"))],
        _build_sft_datasets,
        "Bridge dataset provider over energon_pack GPT-SFT packs.",
        # Bridge < 0.4 (the last on Python < 3.12) names the in-batch flag so in its validate
        pack_sequences_in_batch=property(lambda self: self.enable_in_batch_packing),
    )


def make_bridge_sft_dataset_provider(path: str, tokenizer: Any, *, seq_length: int, **kwargs: Any):
    """A ``ConfigContainer.dataset`` for Bridge's GPT step over a GPT-SFT JSONL (module docstring).

    The packing knobs are the packing spec's (:class:`~energon_pack.packing.spec.PackingSpec`, documented and
    validated there, here at once): ``seq_length``, ``cp``/``tp``/``sp``/``eval_cp`` (the alignment; equal to the
    model's parallel sizes, which :func:`check_bridge_sft_config` checks), ``pad_to_max_length``,
    ``pad_cu_seqlens`` + ``max_segments``, ``overlength``, ``balance``, ``cost_model`` (None: ``cfg.model``, priced by
    :func:`check_bridge_sft_config`), ``seed``. Old names go through the spec's table: ``pad_seq_to_mult`` is
    accepted with one DeprecationWarning, Bridge's ``context_parallel_size`` & co. are refused naming ``cp``/...

    Args:
        path: the training GPT-SFT JSONL file.
        tokenizer: what :class:`JsonlSFTDataset` takes (a tokenizer object, ``"demo"``, a Qwen-VL name).
        seq_length: the pack width in tokens; equal to ``model.seq_length`` (:func:`check_bridge_sft_config`).
        kwargs: the spec's knobs above, and ``format`` ("prompt_completion" default | "chat") and ``format_kw``
            (JsonlSFTDataset's format options); ``valid_path`` (None: no validation set); ``enable_in_batch_packing``
            (with micro-batch size > 1); ``shuffle`` (True), ``window`` (4096), ``cache_dir``; and Bridge's
            dataloader fields (``dataloader_type`` "single" default or "cyclic", ``num_workers``, ...).
    """
    kwargs = renamed_knobs("make_bridge_sft_dataset_provider", {"seq_length": seq_length, **kwargs})
    provider = _provider_class()(path=str(path), tokenizer=tokenizer, **kwargs)
    _provider_spec(provider)  # validated now, not when Bridge builds the datasets
    return provider
