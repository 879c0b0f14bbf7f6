"""Loader checkpoints: a hang-safe ``save_state_rank``, a checked ``restore_state_rank``, and reading a state.

These work on any Energon 7.x loader, patched or not (:mod:`energon_pack.energon.compat` patches Energon's own
methods with the same logic on the releases it was tested on). A restore refuses, before anything is restored,
a state saved with another worker count, or (for a loader of our task encoders) for another rank, world size,
shard list, encoder or packing configuration, or edited after saving, with a
:class:`~energon_pack.energon.fingerprint.ResumeConfigError` naming the change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from megatron.energon.savable_loader import SavableDatasetCheckpoint

from .fingerprint import check_guard_state, worker_count_error
from .resume_guard import ResumeGuard


def workers_started(loader: Any) -> bool:
    """True when the loader's worker processes exist (they answer checkpoint commands)."""
    return getattr(loader, "_iterator", None) is not None


def energon_method(cls: type, name: str) -> Callable:
    """``cls.name`` as Energon defined it (behind our patch, if installed)."""
    method = getattr(cls, name)
    return getattr(method, "__wrapped__", method)


def save_state_rank(loader: Any):
    """``loader.save_state_rank()``, safe at any point, including right after ``iter(loader)``.

    Before the workers start, the state is the one the loader would restore from (its initial
    or restored checkpoint), exactly what Energon returns before ``iter(loader)``.

    Args:
        loader: an Energon savable loader (``get_savable_loader(...)``), patched by our guards or not;
            the state is this rank's only (every rank saves and restores its own).
    """
    return save_unhung(loader, energon_method(type(loader), "save_state_rank"))


def save_unhung(loader: Any, save: Callable[[Any], Any]):
    """``save(loader)``, answered from the initial checkpoint while ``iter(loader)`` has not started the workers.

    Energon 7.4's ``__iter__`` sets ``_has_workers`` at ``iter(loader)``, the workers start at the first
    ``next()``; in between its ``save_state_rank`` waits forever on workers that do not exist.
    """
    if getattr(loader, "num_workers", 0) > 0 and getattr(loader, "_has_workers", False) and not workers_started(loader):
        loader._has_workers = False
        try:
            return save(loader)
        finally:
            loader._has_workers = True
    return save(loader)


def restore_state_rank(loader: Any, state: Any) -> None:
    """``loader.restore_state_rank(state)`` with a :class:`ResumeConfigError` instead of Energon's bare
    ``AssertionError`` when the state was saved with another worker count, rank or world size.

    For a loader of our task encoders it also refuses, before anything is restored, a state saved on
    another shard list or with another encoder or packing configuration, or edited after saving.

    Args:
        loader: an Energon savable loader built as the saved one was (same dataset, worker count, rank,
            world size and task encoder), not yet iterated.
        state: this rank's ``save_state_rank()`` result (from :func:`save_state_rank` or Energon's own
            method); None restores nothing (a fresh start).
    """
    check_restore(loader, state)
    energon_method(type(loader), "restore_state_rank")(loader, state)  # checked once: not again behind the patch


def check_restore(loader: Any, state: Any) -> None:
    """Refuse, before anything is restored, a state saved with another worker count, or (for a loader
    of an energon_pack task encoder) another rank, world size, shard list, encoder, knobs or edited parts."""
    if state is None:
        return
    parts = list(getattr(state, "worker_states", None) or [])
    saved = len(parts) if parts and all(isinstance(p, SavableDatasetCheckpoint) for p in parts) else 0
    current = getattr(loader, "num_workers", 0) or 0
    if saved != current:
        raise worker_count_error(saved, current)
    guard = find_guard(loader)
    if guard is not None:
        for saved_guard in guard_states(state):
            check_guard_state(saved_guard, guard.fingerprint)


def find_guard(loader: Any) -> ResumeGuard | None:
    """The :class:`ResumeGuard` of a loader of our task encoders; None for other loaders."""
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
