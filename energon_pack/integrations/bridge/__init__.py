"""Megatron-Bridge: our packs in the batch forms Bridge's training steps read, its config checks, and dataset
providers for Bridge recipes, on its two roads.

* VLM (:mod:`.vlm`): :class:`BridgeQwenVLPackingTaskEncoder` (Energon packs in ``vlm_step``'s form),
  :func:`make_bridge_dataset_provider`, :func:`check_bridge_config`, Bridge-prepared ChatML datasets read as they
  are (:func:`bridge_dataset_kwargs`).
* GPT-SFT (:mod:`.gpt_sft`): GPT-SFT JSONL packs for ``gpt_step`` (:func:`make_bridge_sft_dataset_provider`,
  :func:`check_bridge_sft_config`) and the GPT-SFT packing rules of in-batch and offline packs
  (:func:`check_gpt_sft_config`).

Both roads share one table of the rules Bridge imposes and the one translation of Bridge's knob names into the
packing spec's (:mod:`.rules`), the batch forms (:mod:`.batch`), MTP on packs (:mod:`.mtp`) and the provider
class (:mod:`.provider`). Nothing here imports Bridge or Megatron-Core at module import time.
"""

from __future__ import annotations

from ...energon.bridge_layout import (
    BRIDGE_CHATML_DATASET_CLASSES,
    FIELD_MAP_SUBFLAVOR,
    BridgeChatMLDataset,
    bridge_chatml_to_sample,
    cook_bridge_chatml,
    read_bridge_dataset,
)
from ...errors import ConfigError
from .batch import (
    BRIDGE_BATCH_KEYS,
    GPT_BATCH_KEYS,
    LEGACY_KEYS,
    METADATA_KEYS,
    VisualInputs,
    bridge_visual_inputs_class,
    to_bridge_batch,
    to_gpt_batch,
)
from .gpt_sft import (
    PACK_TOPOLOGY_KEYS,
    SFTPackDataset,
    build_sft_pack_dataset,
    check_bridge_sft_config,
    check_gpt_sft_config,
    make_bridge_sft_dataset_provider,
    pack_topology_record,
)
from .mtp import MTP_PACKED_MCORE
from .rules import RULES, SPEC_NAMES, packing_knobs
from .vlm import (
    LOADER_OWNED_DATASET_KWARGS,
    POSITION_MODES,
    BridgeQwenVLPackingTaskEncoder,
    bridge_dataset_kwargs,
    check_bridge_config,
    loader_owned_dataset_kwargs,
    make_bridge_dataset_provider,
)

__all__ = [
    "BRIDGE_BATCH_KEYS",
    "BRIDGE_CHATML_DATASET_CLASSES",
    "FIELD_MAP_SUBFLAVOR",
    "GPT_BATCH_KEYS",
    "LEGACY_KEYS",
    "LOADER_OWNED_DATASET_KWARGS",
    "METADATA_KEYS",
    "MTP_PACKED_MCORE",
    "PACK_TOPOLOGY_KEYS",
    "POSITION_MODES",
    "RULES",
    "SPEC_NAMES",
    "BridgeChatMLDataset",
    "BridgeQwenVLPackingTaskEncoder",
    "ConfigError",
    "SFTPackDataset",
    "VisualInputs",
    "bridge_chatml_to_sample",
    "bridge_dataset_kwargs",
    "bridge_visual_inputs_class",
    "build_sft_pack_dataset",
    "check_bridge_config",
    "check_bridge_sft_config",
    "check_gpt_sft_config",
    "cook_bridge_chatml",
    "loader_owned_dataset_kwargs",
    "make_bridge_dataset_provider",
    "make_bridge_sft_dataset_provider",
    "packing_knobs",
    "pack_topology_record",
    "read_bridge_dataset",
    "to_bridge_batch",
    "to_gpt_batch",
]
