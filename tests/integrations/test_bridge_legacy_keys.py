"""``to_gpt_batch(legacy_keys=True)`` (the GPT-SFT provider's collate) against Bridge <= 0.5's packed-seq rule.

Bridge <= 0.5's ``get_packed_seq_params`` (v0.5.1 ``training/utils/packed_seq_utils.py``; the installed wheel's
legacy branch is the same code) takes Transformer Engine's slower padded THD path whenever ``cu_seqlens_unpadded``
is in the batch. Issue 45: we emitted it equal to ``cu_seqlens`` when nothing was padded. Now it is left out then,
as Bridge's own collate does (only with ``pad_seq_to_mult > 1``), and kept where segments are padded or the
boundaries are static (``pad_cu_seqlens``: the same keys every step).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from energon_pack.integrations.bridge import to_gpt_batch
from energon_pack.thd import ThdLayout, ThdSegment, build_thd_batch

sys.path.insert(0, str(Path(__file__).parents[1]))
from _bridge_light import bridge_module, bridge_version  # noqa: E402

needs_bridge = pytest.mark.skipif(bridge_version() is None, reason="megatron-bridge wheel not installed")
#: what Bridge <= 0.5 reads of the packed metadata
OLD_KEYS = ("cu_seqlens", "cu_seqlens_argmin", "cu_seqlens_unpadded", "cu_seqlens_unpadded_argmin", "max_seqlen")


def _row(pad_multiple: int, **layout_kw) -> dict:
    """Our THD row of two segments of 3 and 5 tokens (the last token of each unsupervised)."""
    segments = [
        ThdSegment.from_target_mask(torch.arange(1, n + 1), torch.tensor([False] + [True] * (n - 1)), key=str(n))
        for n in (3, 5)
    ]
    return build_thd_batch(segments, ThdLayout(pad_multiple=pad_multiple, **layout_kw))


def _old(batch: dict) -> dict:
    return {k: batch[k] for k in OLD_KEYS if k in batch}


def _exact(d: dict) -> dict:
    return {k: v.tolist() for k, v in d.items()}


def test_nothing_padded_leaves_out_cu_seqlens_unpadded():
    out = to_gpt_batch(_row(1, seq_length=16))
    assert _exact(_old(out)) == {"cu_seqlens": [[0, 3, 8]], "cu_seqlens_argmin": 3, "max_seqlen": 5}
    assert "cu_seqlens_q_padded" not in out and out["cu_seqlens"].dtype == torch.int32


def test_padded_segments_keep_both_boundaries():
    out = to_gpt_batch(_row(4, seq_length=16))
    assert _exact(_old(out)) == {
        "cu_seqlens": [[0, 4, 12]],
        "cu_seqlens_argmin": 3,
        "cu_seqlens_unpadded": [[0, 3, 8]],
        "cu_seqlens_unpadded_argmin": 3,
        "max_seqlen": 8,
    }


def test_static_boundaries_keep_the_same_keys_every_step():
    row = _row(1, seq_length=8, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=3)
    out = to_gpt_batch(row, static_cu=True)
    assert _exact(_old(out)) == {
        "cu_seqlens": [[0, 3, 8, 8]],
        "cu_seqlens_argmin": 4,
        "cu_seqlens_unpadded": [[0, 3, 8, 8]],
        "cu_seqlens_unpadded_argmin": 4,
        "max_seqlen": 8,
    }


@needs_bridge
@pytest.mark.parametrize("pad_multiple,kernel", [(1, "unpadded"), (4, "padded")])
def test_bridge_legacy_branch_picks_the_unpadded_kernel_when_nothing_is_padded(pad_multiple, kernel):
    """Bridge's own function on the legacy keys alone (what Bridge <= 0.5 passes it)."""
    psu = bridge_module("training.utils.packed_seq_utils")
    params = psu.get_packed_seq_params(_old(to_gpt_batch(_row(pad_multiple, seq_length=16))))
    got = {k: getattr(params, k) for k in ("cu_seqlens_q", "cu_seqlens_q_padded", "max_seqlen_q")}
    got = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in got.items()}
    if kernel == "unpadded":
        assert got == {"cu_seqlens_q": [0, 3, 8], "cu_seqlens_q_padded": None, "max_seqlen_q": 5}
    else:
        assert got == {"cu_seqlens_q": [0, 3, 8], "cu_seqlens_q_padded": [0, 4, 12], "max_seqlen_q": 8}
