"""Megatron-Energon's webdataset index, written in pure Python (no torch, no Energon import).

``energon prepare`` (``BaseWebdatasetFactory.prepare_dataset``) reads every tar's headers and writes, for
a local folder of shards:

- ``NAME.tar.idx`` per shard: the byte offset of each sample's first member, then the end offset
  (little-endian uint64);
- ``.nv-meta/index.sqlite``: tables ``samples`` (one row per sample) and ``sample_parts`` (one row per
  member: the content offset and size) and their indexes;
- ``.nv-meta/index.uuid`` (a fresh uuid4), ``.nv-meta/.info.json`` (``energon_version``, ``shard_counts``)
  and ``.nv-meta/split.yaml`` (the shards of each split part, brace-collapsed).

:func:`write_webdataset_index` writes the same files with the same bytes and rows (the uuid aside) by the
same rules, read from Energon 7.4's ``flavors/webdataset/{prepare,indexing,itar,config}.py`` and
``bracecollapse.py`` (identical in 7.4.0 and 7.4.1; a test compares the two outputs). It is what a
command that must start fast uses (Energon's import costs about two seconds, torch included), and only on
a release in :data:`~.releases.TESTED_ENERGON_VERSIONS` (:func:`index_writer_matches_energon`); elsewhere
Energon's own ``prepare_dataset`` runs. Shards are read one after the other (headers only).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import struct
import tarfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from energon_pack.errors import ConfigError

from .releases import TESTED_ENERGON_VERSIONS, installed_energon_version

MAIN_FOLDER = ".nv-meta"
INDEX_SQLITE = "index.sqlite"
INDEX_UUID = "index.uuid"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"
SPLIT_YAML = "split.yaml"
TAR_INDEX_SUFFIX = ".idx"  # data-000000.tar -> data-000000.tar.idx

#: Energon's member-name rules (``flavors/webdataset/config.py``): ``KEY.PART`` (the key ends at the first
#: dot of the last path component) and ``__meta__`` entries that are no sample part
_SPLIT_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_SKIP_META = re.compile(r"__[^/]*__($|/)")

#: Energon's schema (``indexing.py`` ``SqliteIndexWriter``), statement for statement
_CREATE_TABLES = (
    """
                CREATE TABLE IF NOT EXISTS samples (
                    tar_file_id INTEGER NOT NULL,
                    sample_key TEXT NOT NULL UNIQUE,
                    sample_index INTEGER NOT NULL,
                    byte_offset INTEGER,
                    byte_size INTEGER
                )
                """,
    """
                CREATE TABLE IF NOT EXISTS sample_parts (
                    tar_file_id INTEGER,
                    sample_index INTEGER,
                    part_name TEXT,
                    content_byte_offset INTEGER,
                    content_byte_size INTEGER
                )
                """,
)
_DROP = (
    "DROP INDEX IF EXISTS idx_samples_sample_key",
    "DROP INDEX IF EXISTS idx_samples_by_tar_and_idx",
    "DROP TABLE IF EXISTS samples",
    "DROP INDEX IF EXISTS idx_sample_parts_seq",
    "DROP INDEX IF EXISTS idx_sample_parts_full",
    "DROP TABLE IF EXISTS sample_parts",
)
_CREATE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
    "content_byte_offset, content_byte_size)",
)
_INSERT_SAMPLES = """
                INSERT INTO samples (tar_file_id, sample_key, sample_index, byte_offset, byte_size)
                VALUES (?, ?, ?, ?, ?)
                """
_INSERT_PARTS = """
            INSERT INTO sample_parts (tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)
            VALUES (?, ?, ?, ?, ?)
            """


def index_writer_matches_energon() -> bool:
    """Whether the installed Energon is a release this writer was checked against (read from package
    metadata: nothing is imported)."""
    return installed_energon_version() in TESTED_ENERGON_VERSIONS


def _tar_samples(path: Path, shard_id: int) -> tuple[list[tuple], list[tuple], list[int]]:
    """One shard's sample rows, part rows and ``.tar.idx`` offsets, by Energon's ``_preprocess_tar`` rules
    (consecutive members with the same key are one sample)."""
    samples: list[tuple] = []
    parts: list[tuple] = []
    offsets: list[int] = []
    last_key = None
    with path.open("rb") as f, tarfile.open(fileobj=f, mode="r:*") as tar:
        for member in tar:
            if not member.isreg() or member.name is None or _SKIP_META.match(member.name):
                continue
            match = _SPLIT_NAME.match(member.name)
            if match is None:
                continue
            key, part = match.group(1), match.group(2)
            if key != last_key:
                offsets.append(member.offset)
                samples.append([shard_id, key, len(samples), member.offset, None])
                last_key = key
            parts.append((shard_id, len(samples) - 1, part, member.offset_data, member.size))
        offsets.append(tar.offset)
    for sample, end in zip(samples, offsets[1:]):
        sample[4] = end - sample[3]
    return [tuple(s) for s in samples], parts, offsets


def _collapse(names: Sequence[str]) -> list[str]:
    """Energon's order-keeping brace collapse (``bracecollapse.collapse(keep_order=True)``): a run of names
    that differ in one numeric slot, counting up by one at the same width, becomes ``a{000..007}b``."""
    tokens = [(re.split(r"\d+", name), re.findall(r"\d+", name)) for name in names]
    out: list[str] = []
    i = 0
    while i < len(names):
        lits0, nums0 = tokens[i]
        slot, prev, end = -1, nums0, i
        for j in range(i + 1, len(names)):
            lits1, nums1 = tokens[j]
            if not nums0 or lits1 != lits0 or len(nums1) != len(nums0):
                break
            diff = [k for k, (a, b) in enumerate(zip(prev, nums1)) if int(a) != int(b)]
            if len(diff) != 1 or len(nums1[diff[0]]) != len(prev[diff[0]]) or slot not in (-1, diff[0]):
                break
            if int(nums1[diff[0]]) != int(prev[diff[0]]) + 1:
                break
            slot, prev, end = diff[0], nums1, j
        if end > i:
            nums = [f"{{{nums0[k]}..{prev[k]}}}" if k == slot else n for k, n in enumerate(nums0)]
            out.append("".join(lit + num for lit, num in zip(lits0, nums)) + lits0[-1])
        else:
            out.append(names[i])
        i = end + 1
    return out


def _split_parts(names: Sequence[str], ratio: Sequence[tuple[str, float]]) -> dict[str, list[str]]:
    """Energon's ratio split of the shards in order (no shuffle), each part brace-collapsed."""
    total = sum(r for _, r in ratio)
    parts: dict[str, list[str]] = {}
    cumulative, start = 0.0, 0
    for part, r in ratio:
        cumulative += r / total
        end = int(len(names) * cumulative)
        parts[part] = _collapse(names[start:end])
        start = end
    return parts


def _chmod(path: Path, mode: int | None) -> None:
    if mode is None:
        return
    try:
        path.chmod(mode)
    except OSError:  # as Energon: permissions are a courtesy
        pass


def _write_tar_index(shard: Path, offsets: list[int]) -> None:
    """``NAME.tar.idx`` through ``NAME.tar.idx.tmp`` (only complete files carry the final name)."""
    final = shard.with_name(shard.name + TAR_INDEX_SUFFIX)
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_bytes(struct.pack(f"<{len(offsets)}Q", *offsets))
    os.replace(tmp, final)
    _chmod(final, shard.stat().st_mode | 0o600)


def _insert_samples(db: sqlite3.Connection, samples: list[tuple], shard: Path) -> None:
    """The sample rows of one shard, all or none (Energon's savepoint); a key already taken (``sample_key``
    is UNIQUE) is a ConfigError naming it."""
    db.execute("SAVEPOINT append_samples_batch")
    try:
        db.executemany(_INSERT_SAMPLES, samples)
        db.execute("RELEASE SAVEPOINT append_samples_batch")
    except sqlite3.IntegrityError:
        db.execute("ROLLBACK TO SAVEPOINT append_samples_batch")
        db.execute("RELEASE SAVEPOINT append_samples_batch")
        seen: set[str] = set()
        dup = samples[0][1]
        for row in samples:
            key = row[1]
            if key in seen or db.execute("SELECT 1 FROM samples WHERE sample_key = ?", (key,)).fetchone():
                dup = key
                break
            seen.add(key)
        raise ConfigError(
            "shards",
            f"sample key {dup!r} of {shard} occurs twice (Energon needs every key once across all shards)",
            "rename those samples, or run `energon prepare --fix-duplicates` on the folder",
        ) from None


def write_webdataset_index(
    root: str | Path,
    shards: Sequence[str],
    *,
    split_parts_ratio: Sequence[tuple[str, float]] = (("train", 1.0), ("val", 0.0), ("test", 0.0)),
) -> dict[str, int]:
    """Index the tar ``shards`` (names relative to the local folder ``root``) as Energon's
    ``prepare_dataset(root, shards, split_parts_ratio=..., shuffle_seed=None)`` does; returns the sample
    count of each shard. A shard without samples, a tar that cannot be read and a sample key found twice
    are ConfigErrors naming the shard or key (Energon exits or asserts there)."""
    import yaml

    root = Path(root)
    shards = list(shards)
    if not shards:
        raise ConfigError("shards", f"no *.tar shards to index under {root}", "pass the folder that holds them")
    meta = root / MAIN_FOLDER
    meta.mkdir(exist_ok=True)
    try:  # Energon's permissions: the folder's and the first shard's, owner read/write added
        _chmod(meta, root.stat().st_mode | 0o700)
        file_mode: int | None = (root / shards[0]).stat().st_mode | 0o600
    except OSError:
        file_mode = None
    counts: dict[str, int] = {}
    db = sqlite3.connect(meta / INDEX_SQLITE)
    try:
        db.execute("PRAGMA busy_timeout = 5000;")
        for statement in (*_DROP, *_CREATE_TABLES):
            db.execute(statement)
        for shard_id, name in enumerate(shards):
            path = root / name
            try:
                samples, parts, offsets = _tar_samples(path, shard_id)
            except (OSError, tarfile.TarError) as exc:
                raise ConfigError("shards", f"{path} cannot be read as a tar ({exc})", "remove or rewrite it") from None
            if not samples:
                raise ConfigError("shards", f"{path} holds no sample", "remove it or write samples into it")
            _insert_samples(db, samples, path)
            db.executemany(_INSERT_PARTS, parts)
            _write_tar_index(path, offsets)
            counts[name] = len(samples)
        for statement in _CREATE_INDEXES:
            db.execute(statement)
        db.commit()
    finally:
        db.close()
    _chmod(meta / INDEX_SQLITE, file_mode)
    (meta / INDEX_UUID).write_text(str(uuid.uuid4()))
    _chmod(meta / INDEX_UUID, file_mode)
    info = {"energon_version": installed_energon_version(), "shard_counts": counts}
    with (meta / INFO_JSON).open("w") as f:
        json.dump(info, f, indent=2)
    _chmod(meta / INFO_JSON, file_mode)
    if (meta / INFO_YAML).is_file():  # Energon keeps a legacy .info.yaml in step
        with (meta / INFO_YAML).open("w") as f:
            yaml.dump(info, f)
    splits = {"split_parts": _split_parts(shards, split_parts_ratio), "exclude": []}
    with (meta / SPLIT_YAML).open("w") as f:
        yaml.dump(splits, f, sort_keys=False)
    _chmod(meta / SPLIT_YAML, file_mode)
    return counts
