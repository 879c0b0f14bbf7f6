"""Megatron-Bridge's VLM road: the task encoder whose batches are in the form ``vlm_step`` reads, Bridge-prepared
ChatML datasets read as they are, the config check, and the Energon dataset provider for Bridge recipes.

The batch form is :mod:`.batch`'s, the rules :mod:`.rules`' (shared with the GPT-SFT road). Nothing here imports
Bridge or Megatron-Core at module import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from megatron.energon import Cooker, stateless

from ...chat.tokenizer import describe_tokenizer, is_demo_tokenizer
from ...energon import SkippedSample
from ...energon.bridge_layout import (
    FIELD_MAP_SUBFLAVOR,
    bridge_chatml_to_sample,
    cook_bridge_chatml,
    read_bridge_dataset,
)
from ...errors import ConfigError, raise_config_errors
from ...qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from ...thd import alignment_multiple
from .batch import to_bridge_batch
from .mtp import vlm_mtp_error
from .provider import provider_class
from .rules import (
    TOPOLOGY,
    forward_step_error,
    get,
    model_alignment,
    rule_errors,
    topology,
    topology_errors,
    trained_model_cost,
)

__all__ = [
    "BridgeQwenVLPackingTaskEncoder",
    "bridge_dataset_kwargs",
    "check_bridge_config",
    "make_bridge_dataset_provider",
]

POSITION_MODES = ("auto", "mrope", "flat")


# ---------------------------------------------------------------------------------- Bridge datasets
def _config_dir() -> Path:
    from ...env import cache_dir

    return Path(os.environ.get("ENERGON_PACK_CACHE") or cache_dir()) / "bridge_dataset_configs"


def bridge_dataset_kwargs(path: str | Path, *, config_dir: str | Path | None = None) -> dict:
    """``get_train_dataset`` / ``EnergonMultiModalDataModule`` kwargs that read a Bridge-prepared
    ChatML dataset as it is, through Energon's crude path (no Bridge import, no image decoding,
    nothing written into the dataset).

    Bridge's ``dataset.yaml`` names its ``ChatMLWebdataset`` class, which Energon would import and
    whose decoders turn every image into a float tensor before our encoder sees it. Instead we
    point Energon's ``dataset_config`` at a CrudeWebdataset description (written once per field
    map under ``config_dir``, default ``bridge_dataset_configs`` in :func:`energon_pack.env.cache_dir`) that
    carries Bridge's field map as a subflavor for :func:`cook_bridge_chatml`. The shards, index
    and ``split.yaml`` are Bridge's. Returns ``{}`` for a dataset already declared crude.

    Args:
        path: the prepared dataset folder (the one holding ``.nv-meta/dataset.yaml``), as given to
            ``get_train_dataset``; only read. A ``dataset.yaml`` naming neither Bridge's ``ChatMLWebdataset``
            nor a ``CrudeWebdataset`` is a ConfigError.
        config_dir: the local folder the crude description is written into (one small YAML file per field
            map, named by its hash, written atomically so several ranks may share it). Default None:
            ``bridge_dataset_configs`` under ``$ENERGON_PACK_CACHE`` or else :func:`energon_pack.env.cache_dir`,
            the user cache folder, because the dataset itself is never written to.
    """
    spec = read_bridge_dataset(path)
    if spec.is_crude:
        return {}
    if not spec.is_bridge_chatml:
        raise ConfigError(
            "dataset.yaml",
            f"declares {spec.module}.{spec.cls}, not Bridge's ChatMLWebdataset nor a CrudeWebdataset",
            "prepare the shards as Bridge's ChatML WebDataset or with energon_pack.energon.prepare_webdataset",
        )
    subflavors = {**spec.subflavors, FIELD_MAP_SUBFLAVOR: spec.field_map}
    text = yaml.safe_dump(
        {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "subflavors": subflavors}, sort_keys=True
    )
    folder = Path(config_dir) if config_dir is not None else _config_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"crude-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not target.is_file() or target.read_text() != text:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)  # atomic: several ranks may write the same file
    return {"dataset_config": str(target.resolve())}


# ---------------------------------------------------------------------------------- the task encoder
class BridgeQwenVLPackingTaskEncoder(QwenVLPackingTaskEncoder):
    """:class:`QwenVLPackingTaskEncoder` whose batches are in the form Bridge's VLM step reads.

    ``bridge_position_ids``: ``"auto"`` (default) gives ``"mrope"`` [3, 1, T] for Qwen3-VL
    presets and ``"flat"`` [1, T] for Qwen2/2.5-VL (Bridge recomputes those inside the model).
    Reads our ChatML shards, Bridge's ChatML shards through the crude path (see
    :func:`bridge_dataset_kwargs`), and Bridge's typed ``ChatMLSample`` when Energon loads a
    Bridge ``dataset.yaml`` with Bridge installed (decoded images are re-encoded as PNG).

    Args:
        bridge_position_ids: which positions the converted batches carry as ``position_ids`` (see
            :func:`to_bridge_batch`): ``"auto"``, ``"mrope"`` ([3, 1, T] M-RoPE positions) or ``"flat"``
            ([1, T] per-segment positions). Default ``"auto"``: ``"mrope"`` for presets with Qwen3's rope
            style, ``"flat"`` otherwise, what each Bridge model reads (Qwen2/2.5-VL recompute M-RoPE from
            ``cu_seqlens`` and overwrite what they are given; Qwen3-VL uses the passed tensor as is).
        **kwargs: the arguments of :class:`QwenVLPackingTaskEncoder` (``tokenizer``, ``preset``, ``chat``,
            ``config``, ``video_sampling`` and :class:`PackingConfig` fields such as ``seq_length``, ``cp``,
            ``tp``, ``sp``, ``pad_to_max_length``), with the same defaults. A preset with
            ``pixel_dtype="uint8"`` is refused (Bridge's vision model would get raw 0..255 values), and
            ``static_visual=True`` is refused by :func:`to_bridge_batch` and :func:`check_bridge_config`
            (Bridge's vision models pad for their own CUDA graphs).
    """

    cookers = [Cooker(cook_bridge_chatml)]

    def __init__(self, *, bridge_position_ids: str = "auto", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if bridge_position_ids not in POSITION_MODES:
            raise ConfigError(
                "bridge_position_ids", f"unknown mode {bridge_position_ids!r}", f"use one of {POSITION_MODES}"
            )
        if self.preset.pixel_dtype == "uint8":
            raise ConfigError(
                "pixel_dtype",
                "uint8 pixels would reach Bridge's vision model as raw 0..255 values",
                "use pixel_dtype 'float32' or 'bfloat16' with Megatron-Bridge",
            )
        if bridge_position_ids == "auto":
            bridge_position_ids = "mrope" if self.preset.rope_style == "qwen3" else "flat"
        self.bridge_position_ids = bridge_position_ids

    @stateless
    def preencode_sample(self, sample: Any):
        if not hasattr(sample, "fields") and hasattr(sample, "conversation"):
            try:
                sample = bridge_chatml_to_sample(sample)
            except Exception as exc:  # undecodable or unsafe media: a counted skip, like our own path
                reason = getattr(exc, "reason", "bad_media")
                return SkippedSample.derive_from(sample, reason=reason, detail=getattr(exc, "detail", str(exc)))
        return super().preencode_sample(sample)

    @stateless
    def encode_batch(self, batch: dict) -> dict:
        return to_bridge_batch(batch, position_ids=self.bridge_position_ids, static_cu=self.packing.pad_cu_seqlens)


# ---------------------------------------------------------------------------------- config checks
def _demo_tokenizer_error(task_encoder: Any) -> ConfigError:
    preset = getattr(getattr(task_encoder, "preset", None), "name", None) or "qwen2.5-vl"
    return ConfigError(
        "task_encoder tokenizer",
        f"is {describe_tokenizer(task_encoder.tokenizer)}: its ids mean nothing to the model's embedding, and its "
        "token counts (so packs, skips and fill) are not the model's",
        f'build the encoder with tokenizer=load_tokenizer("{preset}") (energon_pack.chat.tokenizer; the real Qwen '
        "tokenizer) or your model's Hugging Face tokenizer; pass allow_demo_tokenizer=True only for a dry run "
        "that never trains",
    )


def _pack_alignment(cfg: Any, task_encoder: Any) -> tuple[int, str]:
    """The segment alignment of the packs that train (the encoder's when known, else what ``cfg``'s parallel
    sizes call for; 0 when they are no sizes) and the knobs behind it, in words."""
    sizes = {k: get(cfg, k, None) for k in TOPOLOGY}
    shown = {k: v for k, v in sizes.items() if v is True or v not in (None, 1, False)}  # True == 1: kept
    words = ", ".join(f"{k}={v}" for k, v in shown.items()) or "the task encoder's"
    return (task_encoder.layout.pad_multiple if task_encoder is not None else model_alignment(cfg)), words


def check_bridge_config(
    cfg: Any, task_encoder: Any = None, *, forward_step_func: Callable | None = None, allow_demo_tokenizer: bool = False
) -> None:
    """Check a Bridge ``ConfigContainer`` (or any object with the same attribute paths) for packed
    THD training with our encoder; raises one :class:`ConfigError` naming every wrong setting
    (``.errors`` lists them one by one when there are several).

    Bridge enforces these itself only for its own native Energon packing
    (``ConfigContainer.validate``); with a dataset provider nothing does. Checked: MBS 1
    (``train.micro_batch_size``) and eval MBS 1 (``validation.eval_micro_batch_size``; None is
    fine, Bridge then uses ``train.micro_batch_size``), per-token loss
    (``model.calculate_per_token_loss=True``: otherwise each pack's loss is divided by its own
    token count and packs are reweighted), ``ddp.average_in_collective=False``, no pipeline
    parallelism, MTP only where Megatron-Core masks it at our packed boundaries (:func:`.mtp.vlm_mtp_error`),
    CUDA graphs only on static packs (:func:`_check_cuda_graphs`), MoE EP overlap and
    ``delay_wgrad_compute`` off (model and
    ``comm_overlap``), no Qwen3-VL DistTrain, and, with a task encoder, CP/TP/SP/eval-CP equal to
    the encoder's (same alignment multiple), ``model.seq_length`` >= the pack width, a fixed width
    when EP > 1 (Bridge forces one), and a real tokenizer: the demo tokenizer is refused unless
    ``allow_demo_tokenizer=True`` (a dry run that never trains). ``task_encoder`` defaults to the
    encoder of ``cfg.dataset`` when that is :func:`make_bridge_dataset_provider`'s provider; a
    different encoder there is an error. ``forward_step_func`` must be ``vlm_step.forward_step``.

    Args:
        cfg: Bridge's ``ConfigContainer`` (the recipe's config after your changes), or any object with the
            same attribute paths (``train.micro_batch_size``, ``model.context_parallel_size``, ...); a missing
            attribute reads as unset (parallel sizes 1, switches off), except ``train.micro_batch_size`` and
            ``model.calculate_per_token_loss``, which must be set (1 and True).
        task_encoder: the encoder that will produce the packs (one of ours: it has a ``packing`` config),
            checked against the model (alignment, width, tokenizer ids, fixed width, static visual). Default
            None: the encoder of ``cfg.dataset`` when that is :func:`make_bridge_dataset_provider`'s provider,
            so ``check_bridge_config(cfg)`` checks what trains; with neither only the ``cfg`` knobs are checked.
        forward_step_func: the step function that will be passed to ``finetune()``. Default None: not
            checked (Bridge takes it as a separate argument, not from ``cfg``); pass it so a step that drops
            ``visual_inputs`` or rejects packed batches is caught before training.
        allow_demo_tokenizer: accept an encoder built on the shipped demo tokenizer (and skip the
            vision-token-id comparison). Default False: the demo ids mean nothing to the model's embedding and
            its token counts are not the model's; set True only for a dry run that never trains.
    """
    errors = rule_errors(cfg, "vlm")

    def bad(knob: str, problem: str, fix: str) -> None:
        errors.append(ConfigError(knob, problem, fix))

    step = forward_step_error(forward_step_func, "vlm")
    if step is not None:
        errors.append(step)

    provider_encoder = get(cfg, "dataset.task_encoder", None)
    if getattr(provider_encoder, "packing", None) is None:
        provider_encoder = None  # not our provider: Bridge's own dataset configs have no such encoder
    else:
        owned = loader_owned_dataset_kwargs(get(cfg, "dataset.dataset_kwargs", None))
        if owned is not None:
            errors.append(owned)
    if task_encoder is None:
        task_encoder = provider_encoder
    elif provider_encoder is not None and provider_encoder is not task_encoder:
        bad(
            "dataset.task_encoder",
            "is not the task encoder being checked, so the checks below say nothing about what trains",
            "pass the encoder given to make_bridge_dataset_provider "
            "(or call check_bridge_config(cfg) to check that one)",
        )
    packing = getattr(task_encoder, "packing", None) if task_encoder is not None else None
    if task_encoder is not None and packing is None:
        raise TypeError(
            f"task_encoder {type(task_encoder).__name__} has no 'packing' config (expected one of our encoders)"
        )
    model = trained_model_cost(cfg)
    for encoder in {id(e): e for e in (task_encoder, get(cfg, "dataset.validation_task_encoder", None))}.values():
        if hasattr(encoder, "price_model"):  # cost_model None: balance prices cfg.model, the model that trains
            encoder.price_model(model)
    mtp = get(cfg, "model.mtp_num_layers", None) or 0
    if mtp > 0:
        mtp_error = vlm_mtp_error(mtp, *_pack_alignment(cfg, task_encoder if packing is not None else None))
        if mtp_error is not None:
            errors.append(mtp_error)
    if packing is not None:
        tokenizer = getattr(task_encoder, "tokenizer", None)
        demo = is_demo_tokenizer(tokenizer)
        if demo and not allow_demo_tokenizer:
            errors.append(_demo_tokenizer_error(task_encoder))
        special = getattr(tokenizer, "special", None)
        if special is not None and not demo:  # a dry run on the demo tokenizer knows its ids are not the model's
            for knob, ours in (
                ("model.image_token_id", special.image_pad),
                ("model.video_token_id", special.video_pad),
                ("model.vision_start_token_id", special.vision_start),
                ("model.vision_end_token_id", special.vision_end),
            ):
                theirs = get(cfg, knob, None)
                if theirs is not None and theirs != ours:
                    bad(
                        knob,
                        f"is {theirs} but the encoder's tokenizer ({describe_tokenizer(tokenizer)}) gives {ours}: "
                        "the model would not find the vision tokens",
                        "build the encoder with the tokenizer of the model being trained",
                    )
        errors.extend(
            topology_errors(
                cfg,
                {"cp": packing.cp, "tp": packing.tp, "sp": packing.sp, "eval_cp": packing.eval_cp},
                packer="the task encoder",
                fix=lambda name, value: f"build the encoder with {name}={value!r}",
            )
        )
        t = topology(cfg)
        want = alignment_multiple(t["cp"], t["tp"], t["sp"], t["eval_cp"])
        have = task_encoder.layout.pad_multiple
        if want != have:
            bad(
                "task_encoder alignment",
                f"segments are aligned to {have}, the model needs lcm(2*CP, CP*TP if SP) = {want}",
                f"build the encoder with cp={t['cp']}, tp={t['tp']}, sp={t['sp']}",
            )
        seq_length = get(cfg, "model.seq_length", None)
        if seq_length is not None and seq_length < packing.seq_length:
            bad(
                "model.seq_length",
                f"is {seq_length}, below the pack width {packing.seq_length}",
                f"set model.seq_length>={packing.seq_length} or build the encoder with seq_length={seq_length}",
            )
        if getattr(task_encoder, "static_visual", False):
            bad(
                "task_encoder static_visual",
                "is True; Bridge's vision models read pixel_values/grid_thw and pad for their own CUDA graphs",
                "build the encoder with static_visual=False (keep max_patches_per_pack)",
            )
        ep = get(cfg, "model.expert_model_parallel_size", 1) or 1
        if ep > 1 and not packing.pad_to_max_length:
            bad(
                "task_encoder pad_to_max_length",
                f"is False with expert_model_parallel_size={ep}; Bridge needs fixed-width rows then",
                "build the encoder with pad_to_max_length=True",
            )
    _check_cuda_graphs(cfg, packing, bad)
    raise_config_errors(errors)


def _names(value: Any) -> list[str]:
    """Scope/module names of a Bridge CUDA-graph knob (enum members, strings, or lists of them)."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple, set)) else [value]
    return [str(getattr(v, "name", v)).split(".")[-1] for v in items]


def _check_cuda_graphs(cfg: Any, packing: Any, bad: Callable[[str, str, str], None]) -> None:
    """Bridge's CUDA graphs on our packs, as its packed-path validation has them (``ConfigContainer.validate``,
    offline packing): every training graph needs a fixed width (``pad_to_max_length``); graphs that capture
    packed attention (``cuda_graph_impl='transformer_engine'`` with no scope or one naming ``attn``, a whole
    layer via ``enable_cuda_graph``, or full iteration) also need static cu_seqlens (``pad_cu_seqlens`` +
    ``max_segments``). A full-iteration graph would hold the vision input, which varies: refused. Vision
    graphs (``vision_cuda_graph_impl``) are refused: Bridge's graphed tower attends across all the images of
    a pack. Dynamic packs: every graph refused."""
    impl = get(cfg, "model.cuda_graph_impl", None) or "none"
    scopes = _names(get(cfg, "model.cuda_graph_scope", None)) + _names(get(cfg, "model.cuda_graph_modules", None))
    layer_graph = get(cfg, "model.enable_cuda_graph", False) is True
    wants = impl != "none" or layer_graph
    full = wants and (
        impl == "full_iteration" or any(n.startswith("full") for n in scopes)
    )  # a scope alone graphs nothing
    static_width = packing is not None and packing.pad_to_max_length
    static_cu = static_width and packing.pad_cu_seqlens
    knob = "model.cuda_graph_impl" if impl != "none" else "model.enable_cuda_graph"
    if wants and not static_width:
        bad(
            knob,
            f"is {impl if impl != 'none' else True!r}; CUDA graphs need static shapes, packs vary in width",
            "build the encoder with pad_to_max_length=True, pad_cu_seqlens=True and max_segments (or set it to 'none')",
        )
    elif full:
        bad(
            knob,
            "captures the full iteration, whose vision input varies from pack to pack",
            "use cuda_graph_impl='transformer_engine' with cuda_graph_scope ['attn', 'mlp'] (per-layer graphs)",
        )
    elif wants and not static_cu and (layer_graph or impl == "local" or not scopes or "attn" in scopes):
        bad(
            knob,
            "captures packed attention, whose cu_seqlens vary in length",
            "build the encoder with "
            "pad_cu_seqlens=True and max_segments (static cu_seqlens), or cuda_graph_scope without 'attn'",
        )
    vision = get(cfg, "model.vision_cuda_graph_impl", None) or "none"
    if vision != "none":
        bad(
            "model.vision_cuda_graph_impl",
            f"is {vision!r}; Bridge's graphed vision tower pads to "
            "max_vision_cuda_graph_seq_length and runs full attention over all patches with only the padding masked, "
            "so the images of a pack (of different samples) would attend to each other",
            "set model.vision_cuda_graph_impl='none' (graph the LLM layers: cuda_graph_impl='transformer_engine')",
        )


# ---------------------------------------------------------------------------------- dataset provider
#: What the provider's loader sets itself and ``dataset_kwargs`` must not hold: the ``get_train_dataset`` arguments
#: Bridge's ``EnergonMultiModalDataModule`` passes (its own config refuses these as "builder-owned") and the
#: datamodule's constructor arguments, which the provider fills from its fields (a duplicate is a raw TypeError).
LOADER_OWNED_DATASET_KWARGS = {
    "batch_size": "always 1 (one packed row per micro-batch)",
    "task_encoder": "the provider's task_encoder",
    "validation_task_encoder": "the provider's validation_task_encoder",
    "worker_config": "built by Bridge from num_workers and the data-parallel rank",
    "split_part": "train / val, chosen by the loader",
    "packing_buffer_size": "the provider's packing_buffer_size",
    "shuffle_buffer_size": "the provider's shuffle_buffer_size",
    "max_samples_per_sequence": "the provider's max_samples_per_sequence",
    "path": "the provider's path",
    "tokenizer": "Bridge's tokenizer",
    "seq_length": "the task encoder's packing.seq_length",
    "decoder_seq_length": "the task encoder's packing.seq_length",
    "micro_batch_size": "always 1 (one packed row per micro-batch)",
    "num_workers": "the provider's num_workers",
    "num_val_workers": "the provider's num_val_workers",
    "pin_memory": "the provider's pin_memory",
    "pg_collection": "Bridge's process groups",
    "multimodal_sample_config": "unused by the THD packs (the task encoder builds every batch)",
}


def loader_owned_dataset_kwargs(dataset_kwargs: Any) -> ConfigError | None:
    """The error for ``dataset_kwargs`` keys the loader owns (each named with where it is set), else None."""
    if dataset_kwargs is None:
        return None
    if not isinstance(dataset_kwargs, dict):
        return ConfigError(
            "dataset_kwargs",
            f"is a {type(dataset_kwargs).__name__}; it holds extra get_train_dataset keyword arguments",
            "pass a dict (or leave it out)",
        )
    owned = sorted(key for key in dataset_kwargs if key in LOADER_OWNED_DATASET_KWARGS)
    if not owned:
        return None
    return ConfigError(
        "dataset_kwargs",
        "holds loader-owned keys " + "; ".join(f"{key} ({LOADER_OWNED_DATASET_KWARGS[key]})" for key in owned),
        "remove them from dataset_kwargs; set the provider fields (make_bridge_dataset_provider keywords) instead",
    )


#: the VLM provider's own fields (name, type, default); Bridge's dataloader fields come from its base class
_PROVIDER_FIELDS = [
    ("path", str, ""),
    ("task_encoder", Any, None),
    ("seq_length", int | None, None),
    ("packing_buffer_size", int, 64),
    ("shuffle_buffer_size", int, 100),
    ("max_samples_per_sequence", int | None, None),
    ("num_val_workers", int | None, None),
    ("do_validation", bool, False),
    ("validation_task_encoder", Any, None),
    ("dataset_kwargs", dict, dataclasses.field(default_factory=dict)),
    ("dataloader_type", str | None, "external"),
]


def _build_datasets(self, context: Any) -> tuple:
    """Bridge's dataset-provider hook: Energon loaders (train, val, None) over our encoder."""
    from megatron.bridge.data.energon.base_energon_datamodule import EnergonMultiModalDataModule

    if self.task_encoder is None or not self.path:
        raise ConfigError(
            "dataset", "the provider needs path and task_encoder", "pass both to make_bridge_dataset_provider"
        )
    owned = loader_owned_dataset_kwargs(self.dataset_kwargs)
    if owned is not None:  # set on the provider after it was made
        raise owned
    kwargs = {**bridge_dataset_kwargs(self.path), **self.dataset_kwargs}
    datamodule = EnergonMultiModalDataModule(
        path=self.path,
        tokenizer=getattr(context, "tokenizer", None),
        seq_length=self.seq_length or self.task_encoder.packing.seq_length,
        task_encoder=self.task_encoder,
        validation_task_encoder=self.validation_task_encoder or self.task_encoder,
        micro_batch_size=1,
        num_workers=self.num_workers,
        num_val_workers=self.num_val_workers,
        pin_memory=self.pin_memory,
        shuffle_buffer_size=self.shuffle_buffer_size,
        max_samples_per_sequence=self.max_samples_per_sequence,
        packing_buffer_size=self.packing_buffer_size,
        pg_collection=getattr(context, "pg_collection", None),
        **kwargs,
    )
    train = datamodule.train_dataloader() if context.train_samples > 0 else None
    val = iter(datamodule.val_dataloader()) if self.do_validation and context.valid_samples > 0 else None
    return train, val, None


def _provider_class() -> type:
    """The VLM provider class (:func:`.provider.provider_class`)."""
    return provider_class(
        "EnergonPackDatasetProvider",
        __name__,
        _PROVIDER_FIELDS,
        _build_datasets,
        "Bridge dataset provider over an energon_pack task encoder.",
    )


def make_bridge_dataset_provider(path: str | Path, task_encoder: Any, *, packing_buffer_size: int = 64, **kwargs: Any):
    """A ``ConfigContainer.dataset`` for a Bridge recipe: Energon loaders over ``task_encoder``.

    ``kwargs``: ``shuffle_buffer_size``, ``max_samples_per_sequence``, ``num_workers``,
    ``num_val_workers``, ``do_validation`` (default False), ``validation_task_encoder``,
    ``dataset_kwargs`` (extra ``get_train_dataset`` kwargs), ``pin_memory``, ... A Bridge-prepared
    ChatML dataset is read as it is (:func:`bridge_dataset_kwargs`). ``dataloader_type`` is
    ``"external"``: Bridge uses the Energon loader as it is, like its own Energon datasets.

    Args:
        path: the prepared Energon dataset (a local folder or ``msc://`` path), ours or Bridge-prepared
            ChatML; only read.
        task_encoder: the encoder that packs the data (e.g. :class:`BridgeQwenVLPackingTaskEncoder`); its
            ``packing.seq_length`` becomes the provider's ``seq_length`` (so ``seq_length`` is not a
            keyword here), and it is the encoder :func:`check_bridge_config` finds in ``cfg.dataset``.
        packing_buffer_size: K, the samples the packer holds per loader worker (Energon's
            ``packing_buffer_size``). Default 64: on the demo data carry fill is 99.8% at K=64 (99.4% at 32)
            at little memory, since the buffer holds encoded bytes; docs/guides/width_and_buffer.md.
        **kwargs: fields of the provider, each with its default: ``shuffle_buffer_size`` (100 samples, the
            shuffle buffer per worker), ``max_samples_per_sequence`` (None: no limit, Energon's default),
            ``num_workers`` (2, loader workers per rank, Bridge's ``DatasetProvider`` default),
            ``num_val_workers`` (None: ``num_workers``), ``do_validation`` (False: no validation loader, so
            nothing is read from a validation split unless asked), ``validation_task_encoder`` (None:
            ``task_encoder``), ``dataset_kwargs`` (``{}``: extra ``get_train_dataset`` kwargs, applied over
            :func:`bridge_dataset_kwargs`), ``dataloader_type`` (``"external"``) and Bridge's dataloader
            fields ``pin_memory``, ``data_sharding``, ``drop_last``, ``persistent_workers`` (all True),
            ``trust_remote_code``, ``dataloader_save``, ``dataloader_load`` (None). The micro-batch size is
            always 1 (one packed row per micro-batch).
    """
    owned = loader_owned_dataset_kwargs(kwargs.get("dataset_kwargs"))
    if owned is not None:
        raise owned
    return _provider_class()(
        path=str(path),
        task_encoder=task_encoder,
        packing_buffer_size=packing_buffer_size,
        seq_length=task_encoder.packing.seq_length,
        **kwargs,
    )
