"""The bridge to Megatron-Energon: ChatML samples, the carry-over packing wrapper and mixin, preparation.

Every name is imported on first use (PEP 562), like the package's own face: ``import energon_pack.energon``
(or one of its light submodules, such as :mod:`.index_writer`) loads neither torch nor Megatron-Energon,
so ``energon-pack convert`` starts fast. Importing it patches nothing: the Energon guards (:mod:`.compat`)
are installed when one of our task encoders is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from energon_pack.lazy_exports import lazy_exports

#: public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "CarryOverPackingDataset": ".carry_over",
    "CHATML_COOKERS": ".chatml",
    "ChatMLSample": ".chatml",
    "cook_chatml": ".chatml",
    "parse_chatml": ".chatml",
    "restore_state_rank": ".checkpoint",
    "save_state_rank": ".checkpoint",
    "TESTED_ENERGON_VERSIONS": ".releases",
    "energon_guards_installed": ".compat",
    "install_energon_guards": ".compat",
    "uninstall_energon_guards": ".compat",
    "OVERLENGTH_POLICIES": ".config",
    "PACKING_MODES": ".config",
    "PackingConfig": ".config",
    "DatasetViews": ".dataset_change",
    "split_changed_dataset": ".dataset_change",
    "make_demo_shards": ".demo_data",
    "ResumeConfigError": ".fingerprint",
    "prepare": ".prepare",
    "prepare_jsonl": ".prepare",
    "prepare_webdataset": ".prepare",
    "EncodedSegment": ".samples",
    "PackCandidate": ".samples",
    "PackedSamples": ".samples",
    "SkippedSample": ".samples",
    "AllSkippedError": ".stream",
    "BlendPlan": ".blend",
    "check_blend_shares": ".blend",
    "plan_blend_weights": ".blend",
    "read_blend": ".blend",
    "write_blend": ".blend",
    "EpochPlan": ".plan",
    "plan_epoch": ".plan",
    "source_name": ".sources",
    "CarryOverPackingMixin": ".task_encoder",
    "pack_members": ".task_encoder",
    "TextPackingTaskEncoder": ".text",
}

#: the same names as :data:`_EXPORTS` (a literal, so linters see the re-exports below)
__all__ = [
    "CHATML_COOKERS",
    "OVERLENGTH_POLICIES",
    "PackingConfig",
    "EncodedSegment",
    "PACKING_MODES",
    "CarryOverPackingDataset",
    "DatasetViews",
    "CarryOverPackingMixin",
    "ChatMLSample",
    "PackCandidate",
    "PackedSamples",
    "SkippedSample",
    "TextPackingTaskEncoder",
    "AllSkippedError",
    "ResumeConfigError",
    "TESTED_ENERGON_VERSIONS",
    "energon_guards_installed",
    "install_energon_guards",
    "uninstall_energon_guards",
    "restore_state_rank",
    "save_state_rank",
    "split_changed_dataset",
    "cook_chatml",
    "make_demo_shards",
    "pack_members",
    "parse_chatml",
    "prepare",
    "prepare_jsonl",
    "prepare_webdataset",
    "BlendPlan",
    "check_blend_shares",
    "plan_blend_weights",
    "read_blend",
    "write_blend",
    "EpochPlan",
    "plan_epoch",
    "source_name",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # static analysers see the real names(``X``: re-exported)
    from .blend import (
        BlendPlan,
        check_blend_shares,
        plan_blend_weights,
        read_blend,
        write_blend,
    )
    from .carry_over import (
        CarryOverPackingDataset,
    )
    from .chatml import (
        CHATML_COOKERS,
        ChatMLSample,
        cook_chatml,
        parse_chatml,
    )
    from .checkpoint import (
        restore_state_rank,
        save_state_rank,
    )
    from .compat import (
        energon_guards_installed,
        install_energon_guards,
        uninstall_energon_guards,
    )
    from .config import (
        OVERLENGTH_POLICIES,
        PACKING_MODES,
        PackingConfig,
    )
    from .dataset_change import (
        DatasetViews,
        split_changed_dataset,
    )
    from .demo_data import (
        make_demo_shards,
    )
    from .fingerprint import (
        ResumeConfigError,
    )
    from .plan import (
        EpochPlan,
        plan_epoch,
    )
    from .prepare import (
        prepare,
        prepare_jsonl,
        prepare_webdataset,
    )
    from .releases import (
        TESTED_ENERGON_VERSIONS,
    )
    from .samples import (
        EncodedSegment,
        PackCandidate,
        PackedSamples,
        SkippedSample,
    )
    from .sources import (
        source_name,
    )
    from .stream import (
        AllSkippedError,
    )
    from .task_encoder import (
        CarryOverPackingMixin,
        pack_members,
    )
    from .text import (
        TextPackingTaskEncoder,
    )
