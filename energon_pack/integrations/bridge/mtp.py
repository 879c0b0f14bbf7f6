"""Multi-token prediction (MTP) on packs: where Megatron-Core keeps every MTP target inside its packed sequence.

GPTModel rolls ``labels`` and ``loss_mask`` once per MTP depth; on packs that roll must stop at each segment's
boundary. On the VLM road (``vlm_step`` passes ``loss_mask``) that holds where Megatron-Core's roll takes the
packed-sequence params and follows our segments (probed here); Bridge's GPT step passes no ``loss_mask``, so the
GPT-SFT road refuses MTP.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import torch

from ...errors import ConfigError

_log = logging.getLogger(__name__)

#: The first Megatron-Core whose MTP roll (``roll_tensor(..., packed_seq_params=)``, MCore PR #2173) keeps every
#: MTP target inside its packed sequence; GPTModel rolls ``labels`` and ``loss_mask`` with it once per MTP depth.
#: Bridge PR #5990 (2026-09-07) only lifted Bridge's own guard against MTP with native Energon packing.
MTP_PACKED_MCORE = "0.16.0"
_FIX = "set model.mtp_num_layers=None to train on packs"


def _mcore_mtp_roll() -> Any:
    """Megatron-Core's MTP ``roll_tensor`` (``roll``), ``PackedSeqParams`` (``params``), ``version`` and whether the
    roll takes ``packed_seq_params`` (``packed``), or None where Megatron-Core is not importable here (or is only
    a test stand-in)."""
    import inspect

    try:
        import megatron.core as mcore
        from megatron.core.packed_seq_params import PackedSeqParams
        from megatron.core.transformer.multi_token_prediction import roll_tensor
    except ImportError:
        return None
    if not inspect.isfunction(roll_tensor):
        return None
    packed = "packed_seq_params" in inspect.signature(roll_tensor).parameters
    return SimpleNamespace(roll=roll_tensor, params=PackedSeqParams, version=mcore.__version__, packed=packed)


def _mtp_roll_follows_padded_segments(mcore: Any) -> bool:
    """Whether ``mcore.roll`` keeps MTP targets inside segments that carry alignment padding, probed on an
    8-token pack as Bridge passes it (logical ``cu_seqlens_q`` [0, 2, 5], physical ``_padded`` [0, 4, 8])."""
    logical, physical = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 8], dtype=torch.int32)
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1, 1, 0]])  # segment 0 at 0-1, segment 1 at 4-6, gaps at 2-3 and 7
    params = mcore.params(
        qkv_format="thd",
        cu_seqlens_q=logical,
        cu_seqlens_kv=logical,
        cu_seqlens_q_padded=physical,
        cu_seqlens_kv_padded=physical,
        max_seqlen_q=4,
        max_seqlen_kv=4,
    )
    try:
        labels, _ = mcore.roll(torch.arange(1, 9).unsqueeze(0), shifts=-1, dims=-1, packed_seq_params=params)
        rolled, _ = mcore.roll(mask, shifts=-1, dims=-1, packed_seq_params=params)
    except Exception:  # noqa: BLE001 (a roll that fails on the probe is not shown to handle padded packs)
        return False
    kept = rolled[0].nonzero().flatten().tolist()
    return kept == [0, 4, 5] and labels[0, kept].tolist() == [2, 6, 7]


def vlm_mtp_error(mtp: int, alignment: int, parallel: str) -> ConfigError | None:
    """MTP on VLM packs is right where Megatron-Core rolls MTP targets within each packed sequence (GPTModel rolls
    ``labels`` and ``loss_mask`` by the ``cu_seqlens_q`` Bridge passes) and those are where our segments lie:
    always at alignment 1 (no gap between segments; the fixed-width tail is label -100, loss 0), at alignment > 1
    only where the roll follows padded segments (probed). Without Megatron-Core here: allowed at alignment 1
    with a logged warning saying what is assumed. ``parallel``: the knobs behind ``alignment``, in words."""
    mcore = _mcore_mtp_roll()
    if mcore is not None and not mcore.packed:
        return ConfigError(
            "model.mtp_num_layers",
            f"is {mtp}; Megatron-Core {mcore.version}'s MTP rolls labels across packed segment boundaries (its "
            "roll_tensor takes no packed_seq_params), so each segment's last tokens learn the next segment's",
            f"install Megatron-Core >= {MTP_PACKED_MCORE}, or {_FIX}",
        )
    if alignment != 1 and (mcore is None or not _mtp_roll_follows_padded_segments(mcore)):
        who = f"Megatron-Core {mcore.version}" if mcore is not None else "Megatron-Core (not importable here)"
        return ConfigError(
            "model.mtp_num_layers",
            f"is {mtp} on packs aligned to {alignment or '?'} ({parallel}): {who} rolls the MTP labels and loss mask "
            "by the unpadded cu_seqlens_q over padded segments, so MTP targets land on the wrong tokens",
            "train MTP with model.context_parallel_size=1 and model.sequence_parallel=False or "
            f"model.tensor_model_parallel_size=1 (alignment 1), or {_FIX}",
        )
    if mcore is None:
        _log.warning(
            "MTP on packs: Megatron-Core is not importable here, so its masking at packed boundaries is unchecked; "
            "assumed the job runs Megatron-Core >= %s",
            MTP_PACKED_MCORE,
        )
    return None


def gpt_sft_mtp_error(mtp: int) -> ConfigError:
    """MTP on the GPT-SFT road: always refused (Bridge's GPT step passes no ``loss_mask`` to the model)."""
    return ConfigError(
        "model.mtp_num_layers",
        f"is {mtp}; Bridge's gpt_step.forward_step does not pass loss_mask to the model (Megatron-Bridge "
        "issue #6103), so Megatron-Core trains the MTP loss on every position: prompts and pack padding",
        "set model.mtp_num_layers=None for GPT-SFT packs (the VLM step passes loss_mask: MTP works there)",
    )
