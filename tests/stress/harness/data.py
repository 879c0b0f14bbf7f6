"""A tiny, fast Energon dataset and task encoder for the resume/coverage stress tools and tests.

Each sample is one WebDataset record ``{"__key__": "0000042", "json": {"n": 37}}``: a
sequence of ``n`` token ids derived from the key (so a pack's bytes identify its members).
``{"bad": "<reason>"}`` makes pre-encode reject it (a counted skip); ``{"post_bad": "<reason>"}``
makes post-encode reject it (also counted). It runs the real loader path (crude WebDataset ->
cooker -> pre-encode -> packing wrapper -> post-encode -> THD batch) in microseconds per sample.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.energon import Cooker, DefaultTaskEncoder, SkipSample, stateless

from energon_pack.energon.config import PackingConfig
from energon_pack.energon.samples import EncodedSegment, PackCandidate, SkippedSample
from energon_pack.energon.task_encoder import CarryOverPackingMixin
from energon_pack.energon.text import TextRecordSample, cook_text_record
from energon_pack.errors import SampleSkipped
from energon_pack.thd import ThdSegment


def token_ids(key: str, n: int) -> np.ndarray:
    return ((int(key) * 7919 + np.arange(n)) % 30000 + 1).astype(np.int64)


class StressTaskEncoder(CarryOverPackingMixin, DefaultTaskEncoder):
    """Records of ``n`` synthetic tokens -> THD packs (see the module docstring)."""

    cookers = [Cooker(cook_text_record)]
    decoder = None

    def __init__(self, config: PackingConfig | None = None, **packing_kw: Any) -> None:
        super().__init__()
        self.configure_packing(PackingConfig.build(config, **packing_kw), pad_token_id=0)

    @stateless
    def preencode_sample(self, sample: TextRecordSample) -> PackCandidate | SkippedSample:
        record = json.loads(sample.raw)
        if record.get("bad"):
            return SkippedSample.derive_from(sample, reason=record["bad"])
        n = int(record["n"])
        return PackCandidate.derive_from(
            sample, cost=self.packing.cost(self.layout.segment_span(n)), payload=(n, record.get("post_bad"))
        )

    @stateless
    def postencode_sample(self, sample: PackCandidate) -> EncodedSegment:
        if isinstance(sample, SkippedSample):
            raise SkipSample()
        n, post_bad = sample.payload
        if post_bad:
            self.count_postencode_skip(SampleSkipped(post_bad, "post-encode rejects it"))
        ids = torch.from_numpy(token_ids(sample.__key__, n))
        mask = torch.ones(n, dtype=torch.bool)
        mask[0] = False
        return EncodedSegment.derive_from(sample, segment=ThdSegment.from_target_mask(ids, mask, key=sample.__key__))


def write_shards(root: str | Path, shard_records: Sequence[Iterable[dict]]) -> Path:
    """Write one tar per entry of ``shard_records`` (records: dicts with ``n`` or ``bad``) and prepare.

    Keys are global running numbers (``%07d``). Returns ``root``.
    """
    import webdataset as wds

    from energon_pack.energon.prepare import prepare_webdataset

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    index = 0
    for s, records in enumerate(shard_records):
        with wds.TarWriter(str(root / f"part-{s:05d}.tar")) as sink:
            for record in records:
                sink.write({"__key__": f"{index:07d}", "json": json.dumps(record).encode()})
                index += 1
    prepare_webdataset(root)
    return root


def random_records(count: int, *, seed: int = 0, max_len: int = 300, bad_every: int = 0) -> list[dict]:
    """``count`` records of lognormal lengths (1..max_len); every ``bad_every``-th one is bad."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(max_len / 4), 0.8, count).astype(int), 1, max_len)
    out = []
    for i, n in enumerate(lengths):
        if bad_every and i % bad_every == bad_every - 1:
            out.append({"bad": "invalid_record"})
        else:
            out.append({"n": int(n)})
    return out


def valid_keys(shard_records: Sequence[Sequence[dict]]) -> list[str]:
    keys, index = [], 0
    for records in shard_records:
        for record in records:
            if not record.get("bad") and not record.get("post_bad"):
                keys.append(f"{index:07d}")
            index += 1
    return keys
