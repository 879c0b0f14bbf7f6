"""The resume fingerprint: what decides which packs a rank's loader yields next, built and checked here only.

A loader of our task encoders stores it in its state (:class:`~energon_pack.energon.resume_guard.ResumeGuard`):
rank, world size, worker count, shards (names, sample counts, file sizes), the task encoder, and, with
packing, the packing knobs (``packing_buffer_size`` and what the encoder's ``resume_knobs()`` returns). A
restore whose fingerprint differs, or whose parts no longer match the checksum written with them, is a
:class:`ResumeConfigError` naming the change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from typing import Any, TypedDict

from energon_pack.errors import ConfigError
from energon_pack.packing.step_cost import same_cost_model

#: One shard as the fingerprint sees it: (name, sample count, file size in bytes or None when unknown).
ShardFacts = tuple[str, int, int | None]


class ResumeConfigError(ConfigError):
    """ConfigError for a restore whose loader, dataset or packing configuration differs from the checkpoint's.

    Also constructible from one message: PyTorch re-raises a worker's exception as
    ``type(exc)(formatted_message)``, so the main process still gets this ``ConfigError``.

    Args:
        knob: what changed (``rank``, ``dataset``, ``seq_length``, ...), or the whole formatted message.
        problem: what differs between the checkpoint and this loader.
        fix: what to do instead.
    """

    def __init__(self, knob: str, problem: str | None = None, fix: str | None = None) -> None:
        if problem is None:
            ValueError.__init__(self, knob)
            found = re.search(r"ResumeConfigError: (\w+): ", knob)
            self.knob = found.group(1) if found else "packing"
        else:
            super().__init__(knob, problem, fix)


class ResumeFingerprint(TypedDict, total=False):
    """The fingerprint as stored in a state (plain data: it survives ``torch.save`` and JSON)."""

    rank: int
    world_size: int
    num_workers: int
    shards: list  # [[name, count], ...] sorted
    shard_bytes: list  # [[name, bytes], ...] sorted, known sizes only
    encoder: str
    packing: dict | None  # knob -> value; None without packing


class GuardState(TypedDict):
    """The resume guard's own part of a state."""

    fingerprint: ResumeFingerprint
    checksum: str


def shard_bytes(path: Any) -> int | None:
    """A shard's size, local file or object (a rewrite that keeps the sample count usually changes it);
    None when it cannot be had."""
    from energon_pack.storage import file_size

    try:
        return file_size(path)
    except OSError:
        return None


def resume_fingerprint(
    worker_config: Any, shards: Iterable[ShardFacts], encoder: Any, packing_buffer_size: int | None
) -> ResumeFingerprint:
    """The fingerprint of a rank's loader over ``shards`` with ``encoder`` (packing knobs only with packing)."""
    shards = list(shards)
    preset = getattr(getattr(encoder, "preset", None), "name", None)
    packing = None
    if packing_buffer_size is not None:
        packing = {"packing_buffer_size": packing_buffer_size, **encoder.resume_knobs()}
    return ResumeFingerprint(
        rank=worker_config.rank,
        world_size=worker_config.world_size,
        num_workers=worker_config.num_workers,
        shards=sorted([str(name), int(count)] for name, count, _ in shards),
        shard_bytes=sorted([str(name), size] for name, _, size in shards if size is not None),
        encoder=type(encoder).__name__ + (f"[{preset}]" if preset else ""),
        packing=packing,
    )


def check_fingerprint(saved: dict, current: dict) -> None:
    """Raise ResumeConfigError naming what changed between the checkpoint's loader and this one."""
    if (saved["rank"], saved["world_size"]) != (current["rank"], current["world_size"]):
        raise ResumeConfigError(
            "rank",
            f"the state was saved on rank {saved['rank']} of {saved['world_size']} and is restored on rank "
            f"{current['rank']} of {current['world_size']}, so this rank would yield another rank's share",
            "restore each rank's own state into a run of the same world size (or start a new run without restoring)",
        )
    if saved["num_workers"] != current["num_workers"]:
        raise worker_count_error(saved["num_workers"], current["num_workers"])
    if saved["shards"] != current["shards"]:
        old, new = dict(map(tuple, saved["shards"])), dict(map(tuple, current["shards"]))
        diff = [f"added {n} ({new[n]} samples)" for n in new if n not in old]
        diff += [f"removed {n} ({old[n]} samples)" for n in old if n not in new]
        diff += [f"{n} now has {new[n]} samples, not {old[n]}" for n in old if n in new and old[n] != new[n]]
        only_added = bool(diff) and set(old.items()) <= set(new.items())
        diff = diff or [f"{len(saved['shards'])} shards then, {len(current['shards'])} now, same names"]  # a blend
        fix = "start a new epoch/run without restoring the loader state, or restore with the shards it was saved with"
        if only_added:
            fix += (
                "; to accept the added shards, energon_pack.energon.split_changed_dataset(dataset, state, out) "
                "writes a view of the old shards to restore into and a view of only the added ones"
            )
        raise ResumeConfigError(
            "dataset",
            f"the dataset's shards changed since the state was saved ({', '.join(diff)}), so restoring "
            "it would repeat or skip samples",
            fix,
        )
    if "shard_bytes" in saved and saved["shard_bytes"] != current["shard_bytes"]:
        old, new = dict(map(tuple, saved["shard_bytes"])), dict(map(tuple, current["shard_bytes"]))
        diff = [f"{n} now has {new[n]} bytes, not {old[n]}" for n in old if n in new and old[n] != new[n]]
        diff = diff or ["the shards' sizes are unknown now"]
        raise ResumeConfigError(
            "dataset",
            f"the dataset's shards were rewritten since the state was saved ({', '.join(diff)}; same "
            "sample counts), so restoring it would resume into other samples",
            "start a new epoch/run without restoring the loader state, or restore with the shards it was saved with",
        )
    if saved["encoder"] != current["encoder"]:
        raise ResumeConfigError(
            "encoder",
            f"the state was saved with task encoder {saved['encoder']}, this loader has {current['encoder']}",
            f"restore with {saved['encoder']} (or start a new run without restoring the loader state)",
        )
    _check_knobs(saved.get("packing"), current.get("packing"))


#: packing knobs added after states were first saved, with what a state saved before them packed by
KNOBS_ADDED = {"balance": "tokens", "cost_model": None}


def _check_knobs(saved: dict | None, current: dict | None) -> None:
    """Raise ResumeConfigError naming the first packing knob whose value differs between checkpoint and now."""
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return  # a state saved without packing (or before knobs were stored): nothing to compare
    saved = {**{k: v for k, v in KNOBS_ADDED.items() if k in current}, **saved}
    # a defaulted balance follows packing_mode and the tokens-only packer's knobs: name what the user changed
    # (the mode first, balance last)
    order = {"packing_mode": 0, "balance": 2}
    for knob in sorted(set(saved) | set(current), key=lambda k: (order.get(k, 1), k)):
        old, new = saved.get(knob), current.get(knob)
        if knob == "cost_model" and not same_cost_model(old, new):  # stable names; None: a default, saved before
            raise ResumeConfigError(
                knob,
                f"the checkpoint's packs were balanced under the step-cost model {old or 'of the default'}, this "
                f"loader prices {new}; exact resume needs the same cost model",
                "restore with the cost_model the run was saved with (the same shape name, fitted file or model "
                "config), or start the packing stream fresh without restoring its state",
            )
        if knob == "cost_model":
            continue
        if _plain(old) != _plain(new):
            raise ResumeConfigError(
                knob,
                f"the checkpoint was saved with {knob}={old!r}, this loader has {knob}={new!r}; "
                "exact resume needs the same packing configuration",
                f"restore with {knob}={old!r} (or start the packing stream fresh without restoring its state)",
            )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def worker_count_error(saved: int, current: int) -> ResumeConfigError:
    return ResumeConfigError(
        "num_workers",
        f"the state was saved by a loader with num_workers={saved}, this loader has num_workers={current}",
        f"restore with num_workers={saved}: each worker's position and open bins are its own part of the state",
    )


def state_checksum(state: Any) -> str:
    """SHA-256 over a canonical form of a dataset state (dicts, lists, keys, counters, arrays)."""
    digest = hashlib.sha256()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            digest.update(b"{")
            for key in sorted(node, key=str):
                digest.update(repr(key).encode())
                walk(node[key])
            digest.update(b"}")
        elif isinstance(node, (list, tuple)):
            digest.update(b"[" if isinstance(node, list) else b"(")
            for value in node:
                walk(value)
            digest.update(b"]")
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            walk({f.name: getattr(node, f.name, None) for f in dataclasses.fields(node)})
        elif hasattr(node, "tolist"):  # numpy / torch arrays
            walk(node.tolist())
        else:
            digest.update(f"{type(node).__name__}:{node!r};".encode())

    walk(state)
    return digest.hexdigest()


def check_guard_state(state: Any, fingerprint: ResumeFingerprint) -> None:
    """Refuse a guard state saved for another loader, or whose parts disagree with its checksum."""
    guard = state.get("_resume") if hasattr(state, "get") else None
    if not isinstance(guard, dict) or "checksum" not in guard or "fingerprint" not in guard:
        raise ResumeConfigError(
            "checkpoint",
            "the loader state has no resume fingerprint (it was saved by another task encoder or edited)",
            "restore a state saved by this loader's task encoder, or start a new run without restoring",
        )
    check_fingerprint(guard["fingerprint"], fingerprint)
    if state_checksum(state.get("datasets")) != guard["checksum"]:
        raise ResumeConfigError(
            "checkpoint",
            "the loader state's parts (open bins, held sample keys, counters) do not match the "
            "checksum written when it was saved: it was edited or corrupted and would restore only in part",
            "restore an unmodified checkpoint, or start a new run without restoring the loader state",
        )
