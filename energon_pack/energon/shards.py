"""Cheap integrity checks of prepared WebDataset shards (shard sizes against Energon's index).

``energon prepare`` writes one ``<shard>.tar.idx`` per shard: ``count + 1`` little-endian
uint64 byte offsets, the last one the end of the last sample. A shard shorter than that was
truncated after preparation (an interrupted copy or sync) and would fail deep in the loader
(in a worker) with ``tarfile.ReadError`` naming no file. Per shard only its size (``stat``, or one
HEAD in object storage) and the index's last 8 bytes (one ranged read): no shard is read. Remote
shards are checked on parallel threads (:mod:`energon_pack.storage`).
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.storage import REQUEST_THREADS, file_size, is_remote, read_range, store_errors

from .fingerprint import ShardFacts


def shard_facts(factory: Any) -> list[ShardFacts]:
    """:func:`check_shards`, then every shard of a loaded dataset as the resume fingerprint sees it; a JSONL
    dataset (no shards) is one entry, its sample count."""
    sizes = check_shards(factory)
    shards = [(s.name, s.count, sizes.get(str(s.path))) for s in getattr(factory, "shards", None) or ()]
    if not shards and hasattr(factory, "__len__"):
        shards = [(getattr(factory, "name", type(factory).__name__), len(factory), None)]
    return shards


def check_shards(factory: Any) -> dict[str, int | None]:
    """Raise ConfigError naming the first shard (in the dataset's order) that is missing or smaller
    than its index says; otherwise return each shard's size in bytes by path."""
    shards = [(str(getattr(s, "path", "")), getattr(s, "count", None)) for s in getattr(factory, "shards", None) or ()]
    shards = [(path, count) for path, count in shards if path]
    if any(is_remote(path) for path, _ in shards):
        with (
            store_errors(shards[0][0].rsplit("/", 1)[0]),
            ThreadPoolExecutor(min(REQUEST_THREADS, len(shards))) as pool,
        ):
            facts = list(pool.map(lambda s: _shard_facts(*s), shards))
    else:
        facts = [_shard_facts(path, count) for path, count in shards]
    for (path, count), (size, end, entries) in zip(shards, facts):
        _judge(path, count, size, end, entries)
    return {path: size for (path, _), (size, _, _) in zip(shards, facts)}


def _shard_facts(path: str, count: int | None) -> tuple[int | None, int | None, int]:
    """(shard size or None when missing, the index's last offset or None without an index, index entries)."""
    size = file_size(path)
    if size is None:
        return None, None, 0
    idx = path + ".idx"
    entries = count + 1 if count is not None else (file_size(idx) or 0) // 8
    if entries == 0:
        return size, None, 0
    try:
        tail = read_range(idx, (entries - 1) * 8, 8)
    except FileNotFoundError:
        return size, None, 0  # indexed in the sqlite database only: nothing cheap to compare
    return size, (struct.unpack("<Q", tail)[0] if len(tail) == 8 else None), entries


def _judge(path: str, count: int | None, size: int | None, end: int | None, entries: int) -> None:
    where = "in object storage" if is_remote(path) else "on disk"
    if size is None:
        raise ConfigError(
            "dataset",
            f"shard {path} is listed in the prepared index but missing",
            "re-copy the shard, or re-run `energon prepare` on the dataset folder",
        )
    if end is not None and size < end:
        raise ConfigError(
            "dataset",
            f"shard {path} is truncated: {size} bytes {where}, its index ({os.path.basename(path)}.idx, "
            f"{count if count is not None else entries - 1} samples) ends at byte {end}",
            f"re-copy {os.path.basename(path)} from the source (an interrupted copy/sync), or re-run "
            "`energon prepare` on the dataset folder if the shard was rewritten on purpose",
        )
