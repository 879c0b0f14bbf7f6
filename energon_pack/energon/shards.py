"""Cheap integrity checks of prepared WebDataset shards (file sizes against Energon's index).

``energon prepare`` writes one ``<shard>.tar.idx`` per shard: ``count + 1`` little-endian
uint64 byte offsets, the last one the end of the last sample. A shard shorter than that was
truncated after preparation (an interrupted copy or sync) and would fail deep in the loader
with ``tarfile.ReadError: empty header`` naming no file. Only ``stat`` and an 8-byte read per
shard: no shard is read.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from energon_pack.errors import ConfigError


def check_shards(factory: Any) -> None:
    """Raise ConfigError naming the first shard file smaller than its index says (or missing)."""
    for shard in getattr(factory, "shards", None) or ():
        path = str(getattr(shard, "path", ""))
        if not path or "://" in path:  # remote stores: no cheap stat here
            continue
        check_shard(path, getattr(shard, "count", None))


def check_shard(path: str, count: int | None = None) -> None:
    idx = path + ".idx"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise ConfigError("dataset", f"shard {path} is listed in the prepared index but missing",
                          "re-copy the shard, or re-run `energon prepare` on the dataset folder") from None
    try:
        with open(idx, "rb") as f:
            f.seek(0, os.SEEK_END)
            n = f.tell() // 8
            if n == 0:
                return
            f.seek((n - 1) * 8)
            (end,) = struct.unpack("<Q", f.read(8))
    except FileNotFoundError:
        return  # indexed in the sqlite database only: nothing cheap to compare
    if size < end:
        raise ConfigError(
            "dataset",
            f"shard {path} is truncated: {size} bytes on disk, its index ({os.path.basename(idx)}, "
            f"{count if count is not None else n - 1} samples) ends at byte {end}",
            f"re-copy {os.path.basename(path)} from the source (an interrupted copy/sync), or re-run "
            "`energon prepare` on the dataset folder if the shard was rewritten on purpose",
        )
