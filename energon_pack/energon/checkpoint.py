"""``save_state_rank`` that does not hang between ``iter(loader)`` and the first ``next()``.

Energon 7.4.1's ``SavableDataLoader.__iter__`` (savable_loader.py, ``__iter__``) sets
``self._has_workers = True`` as soon as ``iter(loader)`` is called, but the worker processes
are only started by the first ``next()`` (``_epoch_iter`` is a generator; ``DataLoader.__iter__``
runs inside it). ``save_state_rank`` then takes the "workers running" branch and calls
``_worker_command("get_checkpoint", ...)``, which puts a command on each worker's queue and
blocks on ``result_queue.get()`` with no timeout: no worker exists to answer, so it waits forever.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def workers_started(loader: Any) -> bool:
    """True when the loader's worker processes exist (they answer checkpoint commands)."""
    return getattr(loader, "_iterator", None) is not None


def save_state_rank(loader: Any):
    """``loader.save_state_rank()``, safe at any point, including right after ``iter(loader)``.

    Before the workers start, the state is the one the loader would restore from (its initial
    or restored checkpoint), exactly what Energon returns before ``iter(loader)``.
    """
    if getattr(loader, "num_workers", 0) > 0 and getattr(loader, "_has_workers", False) and not workers_started(loader):
        loader._has_workers = False
        try:
            return loader.save_state_rank()
        finally:
            loader._has_workers = True
    return loader.save_state_rank()


def worker_stats_from_state(state: Any) -> list[dict]:
    """The packing stats of every worker in a ``save_state_rank()`` state (carry and rounds).

    A worker that emitted no pack (all its samples skipped) shows its skips nowhere else: after
    an epoch, ``worker_stats_from_state(loader.save_state_rank())`` reports them.
    """
    found: list[dict] = []

    def walk(node: Any) -> None:
        if hasattr(node, "keys") and hasattr(node, "__getitem__"):  # dict or Energon's FlexState
            node = {k: node[k] for k in node.keys()}
            if isinstance(node.get("_packer_state"), dict):
                found.append(node["_packer_state"]["stats"])
            elif isinstance(node.get("_stats_state"), dict):
                found.append(node["_stats_state"])
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            for field in dataclasses.fields(node):
                walk(getattr(node, field.name, None))

    walk(state)
    return found
