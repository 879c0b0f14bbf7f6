"""Rebuild one pack from its restore key: shared by our carry-over wrapper and the rounds wrapper.

A pack's restore key is ``(wrapper name, pack index, *member keys)``; with a sample encoder
(``postencode_sample``) each member key is ``(wrapper name, encode index, *source key)``. The
members are re-read from the source, re-post-encoded under their saved sample indexes and
packed again, so the pack is bit-identical to the one first emitted.
"""

from __future__ import annotations

from typing import Any

from megatron.energon.errors import handle_restore_errors
from megatron.energon.flavors.base_dataset import add_sample_restore_key, set_sample_restore_key


def restore_pack(wrapper: Any, restore_key: Any) -> Any:
    """The pack of ``restore_key``, rebuilt through ``wrapper``'s source, sample encoder and final packer."""
    wrapper.assert_can_restore()
    name, pack_idx, *member_keys = restore_key
    assert name == type(wrapper).__name__, (name, type(wrapper).__name__)
    pack = []
    for key in member_keys:
        encode_idx = None
        if wrapper.sample_encoder is not None:
            name, encode_idx, *key = key
            assert name == type(wrapper).__name__ and isinstance(encode_idx, int)
        sample = wrapper.dataset.restore_sample(tuple(key))
        if wrapper.sample_encoder is not None:
            with handle_restore_errors(wrapper.worker_config.restore_error_handler, sample):
                with wrapper._sample_encoder_sample_index.ctx(encode_idx):
                    sample = wrapper.sample_encoder(sample)
                sample = add_sample_restore_key(sample, encode_idx, src=wrapper)
        pack.append(sample)
    with wrapper._final_packing_sample_index.ctx(pack_idx):
        packed = wrapper.final_packer(pack)
    return set_sample_restore_key(packed, pack_idx, *member_keys, src=wrapper)
