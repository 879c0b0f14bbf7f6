"""Loader checkpoints: a hang-safe ``save_state_rank``, and the resume guard that refuses a state
restored where it does not belong (another rank, world size, worker count, shard list or encoder,
or parts edited after saving) with a :class:`ResumeConfigError` naming the change.

``save_state_rank`` does not hang between ``iter(loader)`` and the first ``next()``:

Energon 7.4.1's ``SavableDataLoader.__iter__`` (savable_loader.py, ``__iter__``) sets
``self._has_workers = True`` as soon as ``iter(loader)`` is called, but the worker processes
are only started by the first ``next()`` (``_epoch_iter`` is a generator; ``DataLoader.__iter__``
runs inside it). ``save_state_rank`` then takes the "workers running" branch and calls
``_worker_command("get_checkpoint", ...)``, which puts a command on each worker's queue and
blocks on ``result_queue.get()`` with no timeout: no worker exists to answer, so it waits forever.
Importing ``energon_pack.energon`` makes Energon's own method safe too (:func:`guard_energon_save_state_rank`),
and makes a worker that has not begun iterating report the right checkpoint (:func:`guard_energon_worker_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Callable, Dict, Optional

from megatron.energon.flavors.base_dataset import SavableDataset
from megatron.energon.savable_loader import SavableDatasetCheckpoint
from megatron.energon.state import FlexState
from megatron.energon.wrappers.base import BaseWrapperDataset

from .stream import ResumeConfigError


def workers_started(loader: Any) -> bool:
    """True when the loader's worker processes exist (they answer checkpoint commands)."""
    return getattr(loader, "_iterator", None) is not None


def save_state_rank(loader: Any):
    """``loader.save_state_rank()``, safe at any point, including right after ``iter(loader)``.

    Before the workers start, the state is the one the loader would restore from (its initial
    or restored checkpoint), exactly what Energon returns before ``iter(loader)``.
    """
    return _save_state_rank_unhung(loader, _unwrapped(type(loader), "save_state_rank"))


def _save_state_rank_unhung(loader: Any, save: Callable[[Any], Any]):
    if getattr(loader, "num_workers", 0) > 0 and getattr(loader, "_has_workers", False) and not workers_started(loader):
        loader._has_workers = False
        try:
            return save(loader)
        finally:
            loader._has_workers = True
    return save(loader)


def _wrap_method(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``cls.name`` by ``make(original)`` (marked as wrapping it) unless already wrapped."""
    original = getattr(cls, name)
    if getattr(original, "__wrapped__", None) is None:
        setattr(cls, name, functools.wraps(original)(make(original)))


def _unwrapped(cls: type, name: str) -> Callable:
    """``cls.name`` as Energon defined it (behind our guard, if installed)."""
    method = getattr(cls, name)
    return getattr(method, "__wrapped__", method)


def guard_energon_save_state_rank() -> None:
    """Make Energon's own ``SavableDataLoader.save_state_rank`` the hang-safe one (users call it
    directly; Bridge's checkpointing too). Idempotent; the state is Energon's, unchanged."""
    from megatron.energon.savable_loader import SavableDataLoader

    _wrap_method(SavableDataLoader, "save_state_rank",
                 lambda original: lambda self: _save_state_rank_unhung(self, original))


def guard_energon_restore_state_rank() -> None:
    """Make Energon's own ``SavableDataLoader.restore_state_rank`` run :func:`check_restore` first for
    loaders of our task encoders (a changed worker count is otherwise a bare AssertionError inside
    Energon). Other loaders are untouched. Idempotent."""
    from megatron.energon.savable_loader import SavableDataLoader

    def make(original: Callable) -> Callable:
        def restore_state_rank(self, state):
            if _find_guard(self) is not None:
                check_restore(self, state)
            return original(self, state)
        return restore_state_rank

    _wrap_method(SavableDataLoader, "restore_state_rank", make)


def guard_energon_worker_checkpoint() -> None:
    """Make a worker that has not begun iterating answer ``get_checkpoint`` with the state it will
    start from. Idempotent.

    Energon 7.4.1 (savable_loader.py, ``SavableDatasetWrapper``) creates each wrapper with a
    placeholder checkpoint ``(state=None, sample_index=-1)``; ``__iter__`` starts the command thread
    and only then takes ``_command_lock`` to store the real first checkpoint (index 0) or apply a
    restore. A ``save_state_rank()`` whose command is already queued can win that race (a worker
    slow to start, e.g. a loaded machine, while the other worker already delivered a batch):
    ``get_checkpoint`` then answers from the placeholder with ``offset = 0 - (-1) = 1``, so a restore
    skips that worker's first batch (every later batch of that worker is off by one; after a
    restore it would even answer "fresh start" for a restored worker). The state the worker has
    not started from yet is its pending restore (``_workers_restore_from``/``_workers_skip_samples``,
    ``None``/0 when fresh): that is the answer, the one Energon's unreachable "Immediate save after
    restore" branch meant to give.
    """
    from megatron.energon.savable_loader import SavableDatasetWrapper

    def make(original: Callable) -> Callable:
        def get_checkpoint(self, last_sample_indexes):
            checkpoints = self._last_checkpoints
            if len(checkpoints) == 1 and checkpoints[0].state is None and checkpoints[0].sample_index == -1:
                worker = self._worker_id
                return SavableDatasetCheckpoint(state=self._workers_restore_from[worker],
                                                offset=self._workers_skip_samples[worker])
            return original(self, last_sample_indexes)
        return get_checkpoint

    _wrap_method(SavableDatasetWrapper, "get_checkpoint", make)


def worker_stats_from_state(state: Any) -> list[dict]:
    """The packing stats of every worker in a ``save_state_rank()`` state (carry and rounds).

    A worker that emitted no pack (all its samples skipped) shows its skips nowhere else: after
    an epoch, ``worker_stats_from_state(loader.save_state_rank())`` reports them.
    """
    found: list[dict] = []

    def visit(node: dict) -> bool:
        if isinstance(node.get("_packer_state"), dict):
            found.append(node["_packer_state"]["stats"])
        elif isinstance(node.get("_stats_state"), dict):
            found.append(node["_stats_state"])
        return False

    walk_state(state, visit)
    return found


def walk_state(node: Any, visit: Callable[[dict], bool]) -> None:
    """Call ``visit`` on every mapping inside a state (dicts, FlexStates, dataclasses, lists); a
    ``True`` return stops the walk below that mapping."""
    if hasattr(node, "keys") and hasattr(node, "__getitem__"):  # dict or Energon's FlexState
        if not isinstance(node, dict):
            node = {k: node[k] for k in node.keys()}
        if not visit(node):
            for value in node.values():
                walk_state(value, visit)
    elif isinstance(node, (list, tuple)):
        for value in node:
            walk_state(value, visit)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            walk_state(getattr(node, field.name, None), visit)


# ---------------------------------------------------------------------- what a state was saved for
def shard_bytes(path: Any) -> int | None:
    """A shard's size, local file or object (a rewrite that keeps the sample count usually changes it);
    None when it cannot be had."""
    from energon_pack.storage import file_size

    try:
        return file_size(path)
    except OSError:
        return None


def loader_fingerprint(worker_config: Any, shards: Any, encoder: Any) -> dict:
    """What decides which samples a rank's loader yields: rank, world size, workers, shards (names,
    sample counts, file sizes), encoder. ``shards`` holds (name, count, bytes or None)."""
    preset = getattr(getattr(encoder, "preset", None), "name", None)
    return {
        "rank": worker_config.rank,
        "world_size": worker_config.world_size,
        "num_workers": worker_config.num_workers,
        "shards": sorted([str(name), int(count)] for name, count, _ in shards),
        "shard_bytes": sorted([str(name), size] for name, _, size in shards if size is not None),
        "encoder": type(encoder).__name__ + (f"[{preset}]" if preset else ""),
    }


def check_loader_fingerprint(saved: dict, current: dict) -> None:
    """Raise ResumeConfigError naming what changed between the checkpoint's loader and this one."""
    if (saved["rank"], saved["world_size"]) != (current["rank"], current["world_size"]):
        raise ResumeConfigError(
            "rank", f"the state was saved on rank {saved['rank']} of {saved['world_size']} and is restored on rank "
            f"{current['rank']} of {current['world_size']}, so this rank would yield another rank's share",
            "restore each rank's own state into a run of the same world size (or start a new run without restoring)")
    if saved["num_workers"] != current["num_workers"]:
        raise _worker_count_error(saved["num_workers"], current["num_workers"])
    if saved["shards"] != current["shards"]:
        old, new = dict(map(tuple, saved["shards"])), dict(map(tuple, current["shards"]))
        diff = [f"added {n} ({new[n]} samples)" for n in new if n not in old]
        diff += [f"removed {n} ({old[n]} samples)" for n in old if n not in new]
        diff += [f"{n} now has {new[n]} samples, not {old[n]}" for n in old if n in new and old[n] != new[n]]
        only_added = bool(diff) and set(old.items()) <= set(new.items())
        diff = diff or [f"{len(saved['shards'])} shards then, {len(current['shards'])} now, same names"]  # a blend
        fix = "start a new epoch/run without restoring the loader state, or restore with the shards it was saved with"
        if only_added:
            fix += ("; to accept the added shards, energon_pack.energon.split_changed_dataset(dataset, state, out) "
                    "writes a view of the old shards to restore into and a view of only the added ones")
        raise ResumeConfigError(
            "dataset", f"the dataset's shards changed since the state was saved ({', '.join(diff)}), so restoring "
            "it would repeat or skip samples", fix)
    if "shard_bytes" in saved and saved["shard_bytes"] != current["shard_bytes"]:
        old, new = dict(map(tuple, saved["shard_bytes"])), dict(map(tuple, current["shard_bytes"]))
        diff = [f"{n} now has {new[n]} bytes, not {old[n]}" for n in old if n in new and old[n] != new[n]]
        diff = diff or ["the shards' sizes are unknown now"]
        raise ResumeConfigError(
            "dataset", f"the dataset's shards were rewritten since the state was saved ({', '.join(diff)}; same "
            "sample counts), so restoring it would resume into other samples",
            "start a new epoch/run without restoring the loader state, or restore with the shards it was saved with")
    if saved["encoder"] != current["encoder"]:
        raise ResumeConfigError(
            "encoder", f"the state was saved with task encoder {saved['encoder']}, this loader has {current['encoder']}",
            f"restore with {saved['encoder']} (or start a new run without restoring the loader state)")


def _worker_count_error(saved: int, current: int) -> ResumeConfigError:
    return ResumeConfigError(
        "num_workers", f"the state was saved by a loader with num_workers={saved}, this loader has num_workers={current}",
        f"restore with num_workers={saved}: each worker's position and open bins are its own part of the state")


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


class ResumeGuard(BaseWrapperDataset):
    """Outermost wrapper: its state carries the loader fingerprint and a checksum of every inner part.

    A restore saved for another rank, world size, worker count, shard list or encoder is a
    :class:`ResumeConfigError` naming the change; a state whose parts were edited or removed after
    saving (open bins, counters, keys) fails the checksum and is refused before anything is restored.
    """

    _savable_fields = ("_resume",)

    def __init__(self, dataset: SavableDataset, *, fingerprint: dict, worker_config: Any) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.fingerprint = fingerprint
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._resume = None

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self):
        yield from self.dataset

    def save_state(self) -> FlexState:
        inner = [ds.save_state() for ds in self.datasets]
        guard = {"fingerprint": self.fingerprint, "checksum": state_checksum(inner)}
        return FlexState(__class__=type(self).__name__, _resume=guard, datasets=inner)

    def restore_state(self, state: Optional[FlexState]) -> None:
        if state is not None:
            check_state(state, self.fingerprint)
        super().restore_state(state)
        self._resume = None

    def config(self) -> Dict[str, Any]:
        return {"type": type(self).__qualname__, "fingerprint": self.fingerprint, "dataset": self.dataset.config()}

    def __str__(self) -> str:
        return f"ResumeGuard(dataset={self.dataset})"


def check_state(state: Any, fingerprint: dict) -> None:
    """Refuse a guard state saved for another loader, or whose parts disagree with its checksum."""
    guard = state.get("_resume") if hasattr(state, "get") else None
    if not isinstance(guard, dict) or "checksum" not in guard or "fingerprint" not in guard:
        raise ResumeConfigError(
            "checkpoint", "the loader state has no resume fingerprint (it was saved by another task encoder or "
            "edited)", "restore a state saved by this loader's task encoder, or start a new run without restoring")
    check_loader_fingerprint(guard["fingerprint"], fingerprint)
    if state_checksum(state.get("datasets")) != guard["checksum"]:
        raise ResumeConfigError(
            "checkpoint", "the loader state's parts (open bins, held sample keys, counters) do not match the "
            "checksum written when it was saved: it was edited or corrupted and would restore only in part",
            "restore an unmodified checkpoint, or start a new run without restoring the loader state")


# ---------------------------------------------------------------------- restore with clear errors
def restore_state_rank(loader: Any, state: Any) -> None:
    """``loader.restore_state_rank(state)`` with a :class:`ResumeConfigError` instead of Energon's bare
    ``AssertionError`` when the state was saved with another worker count, rank or world size."""
    check_restore(loader, state)
    _unwrapped(type(loader), "restore_state_rank")(loader, state)  # checked once: not again behind the guard


def check_restore(loader: Any, state: Any) -> None:
    """Refuse, before anything is restored, a state saved with another worker count, or (for a loader
    of an energon_pack task encoder) another rank, world size, shard list, encoder or edited parts."""
    if state is None:
        return
    parts = list(getattr(state, "worker_states", None) or [])
    saved = len(parts) if parts and all(isinstance(p, SavableDatasetCheckpoint) for p in parts) else 0
    current = getattr(loader, "num_workers", 0) or 0
    if saved != current:
        raise _worker_count_error(saved, current)
    guard = _find_guard(loader)
    if guard is not None:
        for saved_guard in guard_states(state):
            check_state(saved_guard, guard.fingerprint)


def _find_guard(loader: Any) -> Optional[ResumeGuard]:
    node = getattr(loader, "dataset", None)
    while node is not None and not isinstance(node, ResumeGuard):
        node = getattr(node, "dataset", None)
    return node


def guard_states(state: Any) -> list:
    """Every :class:`ResumeGuard` part of a ``save_state_rank()`` state (one per worker)."""
    found: list = []

    def visit(node: dict) -> bool:
        if node.get("__class__") == ResumeGuard.__name__:
            found.append(node)
            return True
        return False

    walk_state(state, visit)
    return found
