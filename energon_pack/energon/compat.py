"""The Megatron-Energon patches, installed explicitly and only on the Energon releases they were tested on.

Energon 7.4's loader has two flaws our resume depends on (savable_loader.py, the same source in 7.4.0 and 7.4.1):

- ``SavableDataLoader.__iter__`` sets ``_has_workers = True`` as soon as ``iter(loader)`` is called, but the
  worker processes start only at the first ``next()`` (torch's ``_iterator`` is still None). A
  ``save_state_rank()`` in between sends ``get_checkpoint`` to workers that do not exist and blocks forever.
- ``SavableDatasetWrapper`` starts each worker with a placeholder checkpoint ``(state=None, sample_index=-1)``
  and stores the real one only after its command thread runs. A ``get_checkpoint`` that wins that race answers
  ``offset = 1``: the restore skips that worker's first batch (and every later one is off by one).

:func:`install_energon_guards` makes Energon's own methods safe (users and Megatron-Bridge call them directly)
and makes ``restore_state_rank`` refuse a state saved for another loader of our encoders with a
:class:`~energon_pack.energon.fingerprint.ResumeConfigError`. It runs when one of our task encoders is built,
never at import, and patches only a release in :data:`TESTED_ENERGON_VERSIONS`: on another one it installs
nothing and warns once (the patches read private attributes that may have changed). It also refuses the Python
code a dataset's config names (``sample_loader`` / ``part_filter`` hooks, ``__module__`` imports) unless the user
opts in: :mod:`.dataset_code`.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable

import megatron.energon
from megatron.energon.module_loader import ModuleLoader
from megatron.energon.savable_loader import SavableDataLoader, SavableDatasetCheckpoint, SavableDatasetWrapper
from megatron.energon.typed_converter import JsonParser

from .checkpoint import check_restore, find_guard, save_unhung
from .dataset_code import refuse_dataset_hooks, refuse_dataset_imports
from .releases import TESTED_ENERGON_VERSIONS

log = logging.getLogger("energon_pack")

#: The installed release, as the gate reads it (tests monkeypatch it).
ENERGON_VERSION = str(getattr(megatron.energon, "__version__", "unknown"))

_ORIGINALS: dict[tuple[type, str], tuple[Callable, bool]] = {}  # (class, name) -> (original, defined on class)
_warned: list[str] = []


def _unhung_save(original: Callable) -> Callable:
    """``SavableDataLoader.save_state_rank`` that does not hang between ``iter(loader)`` and the first ``next()``."""

    def save_state_rank(self):
        return save_unhung(self, original)

    return save_state_rank


def _checked_restore(original: Callable) -> Callable:
    """``SavableDataLoader.restore_state_rank`` that first refuses, for a loader of our task encoders, a state
    saved for another one (a changed worker count is otherwise a bare AssertionError inside Energon)."""

    def restore_state_rank(self, state):
        if find_guard(self) is not None:
            check_restore(self, state)
        return original(self, state)

    return restore_state_rank


def _pending_checkpoint(original: Callable) -> Callable:
    """``SavableDatasetWrapper.get_checkpoint`` that answers, for a worker still on its placeholder checkpoint,
    the state it will start from: its pending restore (``None``/0 when fresh), what Energon's unreachable
    "Immediate save after restore" branch meant to give."""

    def get_checkpoint(self, last_sample_indexes):
        checkpoints = self._last_checkpoints
        if len(checkpoints) == 1 and checkpoints[0].state is None and checkpoints[0].sample_index == -1:
            worker = self._worker_id
            return SavableDatasetCheckpoint(
                state=self._workers_restore_from[worker], offset=self._workers_skip_samples[worker]
            )
        return original(self, last_sample_indexes)

    return get_checkpoint


_PATCHES = (
    (SavableDataLoader, "save_state_rank", _unhung_save),
    (SavableDataLoader, "restore_state_rank", _checked_restore),
    (SavableDatasetWrapper, "get_checkpoint", _pending_checkpoint),
    (ModuleLoader, "get_function", refuse_dataset_hooks),
    (JsonParser, "_resolve_object", refuse_dataset_imports),
)


def energon_guards_installed() -> bool:
    """True when all the patches are in place."""
    return all((cls, name) in _ORIGINALS for cls, name, _ in _PATCHES)


def install_energon_guards() -> bool:
    """Install the patches on a tested Energon release and return True (idempotent).

    On an untested release nothing is patched, one ``RuntimeWarning`` (per process) names the release, the
    risk and the fix, and this returns False.
    """
    if ENERGON_VERSION not in TESTED_ENERGON_VERSIONS:
        if ENERGON_VERSION not in _warned:
            _warned.append(ENERGON_VERSION)
            message = (
                f"megatron-energon {ENERGON_VERSION} is not one energon_pack's loader guards were tested on "
                f"({', '.join(TESTED_ENERGON_VERSIONS)}), so they are not installed: Energon's own "
                "loader.save_state_rank() called right after iter(loader) can hang, a worker that has not started "
                "iterating can report a stale checkpoint (the restore then skips a batch), and Energon's own "
                "loader.restore_state_rank() does not refuse a state saved for another rank, worker count or "
                "dataset, and Python code a dataset's config names (sample_loader / part_filter hooks, "
                "__module__) runs without ENERGON_PACK_ALLOW_DATASET_CODE. "
                f"Fix: pin megatron-energon=={TESTED_ENERGON_VERSIONS[-1]}, or call "
                "energon_pack.energon.save_state_rank(loader) / restore_state_rank(loader, state) explicitly"
            )
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return False
    for cls, name, make in _PATCHES:
        if (cls, name) not in _ORIGINALS:
            original = getattr(cls, name)
            _ORIGINALS[(cls, name)] = (original, name in vars(cls))
            setattr(cls, name, functools.wraps(original)(make(original)))
    return True


def uninstall_energon_guards() -> None:
    """Put Energon's own methods back (tests; a process that wants Energon unpatched)."""
    for (cls, name), (original, own) in list(_ORIGINALS.items()):
        if own:
            setattr(cls, name, original)
        else:
            delattr(cls, name)
        del _ORIGINALS[(cls, name)]
