"""Accepting a dataset that gained shards since a checkpoint, without repeating a sample.

Energon assigns each rank and worker a slice of the concatenated shard list, so a state saved on
N shards cannot continue on N + 1 (the slices move: samples repeat or are skipped), and the resume
fingerprint refuses it. :func:`split_changed_dataset` is the explicit way to accept the change: it
writes two *views* of the prepared dataset (folders of symlinks plus their own ``.nv-meta``; the
dataset itself is only read):

- ``resume``: exactly the shards the checkpoint was saved with, in the dataset's order. Restore the
  state into a loader built on it: it yields what the checkpoint had not yet delivered, bit for bit.
- ``added``: only the shards added since. A fresh loader on it yields only new samples.

Shards removed or resized since the checkpoint are refused: their delivered samples cannot be told
apart from the rest, so nothing could guarantee "nothing repeated".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checkpoint import guard_states
from .fingerprint import ResumeConfigError, shard_bytes

META = ".nv-meta"
#: .nv-meta files each view writes itself; every other metadata file is linked (index, dataset.yaml, ...)
OWN_META_FILES = {".info.json", ".info.yaml", "split.yaml", "split.json"}


@dataclass(frozen=True)
class DatasetViews:
    """The two prepared views :func:`split_changed_dataset` wrote, and their shards."""

    resume: Path
    added: Path
    resume_shards: tuple[str, ...]
    added_shards: tuple[str, ...]


def saved_shards(state: Any) -> dict[str, int]:
    """Shard name -> sample count the state's loader was built on (from its resume fingerprint)."""
    return _saved(state, "shards")


def _saved(state: Any, key: str) -> dict:
    guards = guard_states(state)
    if not guards:
        raise ResumeConfigError(
            "checkpoint",
            "the loader state has no resume fingerprint, so the shards it was saved with are unknown",
            "pass a state saved by an energon_pack task encoder's loader (loader.save_state_rank())",
        )
    found = {tuple(map(tuple, g["_resume"]["fingerprint"].get(key, ()))) for g in guards}
    if len(found) != 1:
        raise ResumeConfigError(
            "checkpoint",
            "the state's workers were saved with different shard lists",
            "pass one rank's unmodified save_state_rank() state",
        )
    return dict(found.pop())


def _current_shards(path: Path, split_part: str) -> list[tuple[str, int]]:
    """The prepared dataset's shards of ``split_part`` in Energon's order, with their sample counts."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    if not (path / META / "dataset.yaml").is_file():
        raise ConfigError(
            "path",
            f"{path} is not a prepared Energon WebDataset (no {META}/dataset.yaml)",
            "pass the dataset folder the loader reads (prepare it with `energon-pack prepare`)",
        )
    meta = WebdatasetMeta.from_config(EPath(path), split_part=split_part)
    return [(s.name, s.count) for s in meta.shards]


def split_changed_dataset(path: str | Path, state: Any, out: str | Path, *, split_part: str = "train") -> DatasetViews:
    """Write ``out/resume`` (the checkpoint's shards) and ``out/added`` (shards added since) as prepared views.

    ``state`` is one rank's ``save_state_rank()`` result. Raises :class:`ResumeConfigError` when a
    shard was removed or resized (naming it) and :class:`ConfigError` when nothing was added. The
    views symlink the shards, so both folders are local (an ``msc://`` one is refused).

    Args:
        path: the prepared dataset folder as it is now (grown by added shards); only read.
        state: one rank's unmodified ``save_state_rank()`` result, saved by a loader of one of our task
            encoders (its resume fingerprint names the shards, their sample counts and sizes).
        out: a new or empty local folder; the two views are written as ``out/resume`` and ``out/added``.
        split_part: the split whose shards are compared and written into the views. Default ``"train"``:
            the split a training loader (``get_train_dataset``) reads and checkpoints.

    Returns:
        The :class:`DatasetViews`: both view folders and the shard names of each.
    """
    from energon_pack.storage import is_remote

    for knob, value in (("path", path), ("out", out)):
        if is_remote(value):
            raise ConfigError(
                knob,
                f"{value} is in object storage; the views symlink shards, so the dataset and the "
                "views are local folders",
                "run it on a local copy of the dataset",
            )
    path, out = Path(path).resolve(), Path(out)
    old = saved_shards(state)
    current = _current_shards(path, split_part)
    now = dict(current)
    gone = [f"removed {n} ({c} samples)" for n, c in old.items() if n not in now]
    gone += [f"{n} now has {now[n]} samples, not {c}" for n, c in old.items() if n in now and now[n] != c]
    sizes = _saved(state, "shard_bytes")
    size_now = {n: shard_bytes(path / n) for n in sizes if n in now}  # one stat per shard
    gone += [
        f"{n} was rewritten ({size_now[n]} bytes, not {b})"
        for n, b in sizes.items()
        if n in size_now and size_now[n] != b
    ]
    if gone:
        raise ResumeConfigError(
            "dataset",
            f"the dataset lost or changed shards since the state was saved ({', '.join(gone)}); only added "
            "shards can be accepted without repeating or skipping samples",
            "restore the shards it was saved with, or start a new run without restoring the loader state",
        )
    added = [(n, c) for n, c in current if n not in old]
    if not added:
        raise ConfigError(
            "state",
            f"{path} has exactly the shards the state was saved with; nothing to split",
            "restore the state into a loader on the dataset itself (energon_pack.energon.restore_state_rank)",
        )
    if out.exists() and any(out.iterdir()):
        raise ConfigError("out", f"{out} is not empty", "pass a new or empty folder for the two views")
    resume = [(n, c) for n, c in current if n in old]
    for name, shards in (("resume", resume), ("added", added)):
        _write_view(path, out / name, shards, split_part)
    return DatasetViews(out / "resume", out / "added", tuple(n for n, _ in resume), tuple(n for n, _ in added))


def _write_view(source: Path, view: Path, shards: list[tuple[str, int]], split_part: str) -> None:
    """A prepared dataset folder that holds ``shards`` of ``source`` (symlinked) and nothing else."""
    (view / META).mkdir(parents=True)
    for entry in (source / META).iterdir():
        if entry.name not in OWN_META_FILES:
            os.symlink(entry, view / META / entry.name)
    info = {"energon_version": _energon_version(source), "shard_counts": dict(shards)}
    (view / META / ".info.json").write_text(json.dumps(info, indent=2))
    split = {"split_parts": {split_part: [n for n, _ in shards]}, "exclude": []}
    (view / META / "split.yaml").write_text(json.dumps(split, indent=2))  # JSON is YAML
    for name, _ in shards:
        for suffix in ("", ".idx"):
            target = source / (name + suffix)
            if target.exists():
                link = view / (name + suffix)
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, link)


def _energon_version(source: Path) -> str:
    for name in (".info.json", ".info.yaml"):
        info = source / META / name
        if info.is_file():
            import yaml

            return str((yaml.safe_load(info.read_text()) or {}).get("energon_version", ""))
    return ""
