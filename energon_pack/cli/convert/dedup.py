"""``--media-store dedup`` (the default of the ``ours`` layout): each distinct media file stored once, however many
records use it; the loader reads the shared ones back (:mod:`energon_pack.energon.media_store` says how and why).

Two steps, so the shards do not depend on the worker count: a worker moves each record's media members out of its
sample (:func:`stash_media`: written once to the run's temporary store under their SHA-256, the sample keeps a
pending list), then the main process re-streams the chunks' small tars into the shards in source order
(:meth:`MediaHomes.finish`): the first record of each hash gets the bytes as its own member, each later one a
reference to that member. Each distinct file is read once per use (as inline) and written twice (the store, then its
shard); the temporary store is removed with the run's temporary folder."""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from energon_pack.energon.media_store import REFS_FIELD, encode_refs, sha256_hex

from .tar_sink import TarSink

#: the worker's list of a record's media ({field: sha256}), in the temporary chunk tars only
PENDING_FIELD = "pending_media.json"
_NOT_MEDIA = ("__key__", "json")


def stash_media(fields: dict, store_dir: str) -> dict:
    """``fields`` without its media members: each is written to ``store_dir/<sha256>`` unless there already (a
    temporary name, then an atomic rename: two workers with the same bytes write the same file) and listed in a
    :data:`PENDING_FIELD` member."""
    pending = {}
    out = {}
    for name, value in fields.items():
        if name in _NOT_MEDIA:
            out[name] = value
            continue
        sha = sha256_hex(value)
        path = os.path.join(store_dir, sha)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(value)
            os.replace(tmp, path)
        pending[name] = sha
    if pending:
        out[PENDING_FIELD] = json.dumps(pending, sort_keys=True).encode("utf-8")
    return out


@dataclass
class MediaHomes:
    """Where each distinct media file lives (its SHA-256 -> the member that holds it), filled in source order."""

    store_dir: Path
    homes: dict = field(default_factory=dict)
    stored_bytes: int = 0  # the distinct files' bytes, each counted once
    references: int = 0  # media uses written (homes included)

    def place(self, fields: dict) -> dict:
        """A chunk sample -> its shard sample: pending media become the bytes (first use of a hash) or a reference."""
        raw = fields.pop(PENDING_FIELD, None)
        if raw is None:
            return fields
        refs = {}
        for name, sha in sorted(json.loads(raw).items()):
            self.references += 1
            home = self.homes.get(sha)
            if home is None:
                data = (self.store_dir / sha).read_bytes()
                self.homes[sha] = f"{fields['__key__']}.{name}"
                self.stored_bytes += len(data)
                fields[name] = data
            else:
                refs[name] = (home, sha)
        if refs:
            fields[REFS_FIELD] = encode_refs(refs)
        return fields

    def finish(self, chunk_tar: str, shard: Path) -> int:
        """Re-stream ``chunk_tar`` (members grouped by key, as :class:`TarSink` wrote them) into ``shard`` through
        :meth:`place`; returns the shard's size."""
        with tarfile.open(chunk_tar, mode="r|") as src, TarSink(str(shard)) as sink:
            sample: dict = {}
            for member in src:
                key, part = member.name.split(".", 1)
                if sample and sample["__key__"] != key:
                    sink.write(self.place(sample))
                    sample = {}
                sample["__key__"] = key
                sample[part] = src.extractfile(member).read()
            if sample:
                sink.write(self.place(sample))
        os.unlink(chunk_tar)
        return shard.stat().st_size

    @property
    def shared(self) -> bool:
        """Whether any record references another's media (the dataset then needs its media store to be read)."""
        return self.references > len(self.homes)
