"""The installed transformers release: the supported range, and what its Qwen-VL vision towers read.

Shared by the forward kwargs (:mod:`.batch`), the attention registration (:mod:`.attention`) and the static
visual kwargs (:mod:`.static_visual`). Read from the package metadata and the modeling modules, never from the
version string alone; transformers is imported inside functions only.
"""

from __future__ import annotations

import importlib
import warnings

from energon_pack.errors import ConfigError

__all__ = ["SUPPORTED_TRANSFORMERS", "check_transformers_version", "vision_precompute_keys"]

#: The transformers releases energon_pack.integrations.hf supports: 4.57 (the first with Qwen3-VL) through the newest
#: one tested. pyproject's ``hf`` and ``test`` extras declare the same range.
SUPPORTED_TRANSFORMERS = ">=4.57,<5.25"
_OLDEST_TRANSFORMERS = "4.57"
_NEWEST_TESTED_TRANSFORMERS = "5.24"


_VERSION_CHECKED: str | None = None


def check_transformers_version() -> str | None:
    """The installed transformers version, refused with a :class:`ConfigError` when older than
    :data:`SUPPORTED_TRANSFORMERS` (their Qwen-VL code lacks what the packed forward needs; Qwen3-VL
    does not exist before 4.57). A release newer than the newest tested one gets a warning, once.
    ``None`` where transformers is not installed. Read from the package metadata: no import."""
    global _VERSION_CHECKED
    if _VERSION_CHECKED is not None:
        return _VERSION_CHECKED
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        return None
    from packaging.version import Version

    parsed = Version(installed)
    if parsed.release[:2] < Version(_OLDEST_TRANSFORMERS).release[:2]:
        raise ConfigError(
            "transformers",
            f"version {installed} is installed; energon_pack.integrations.hf supports "
            f"transformers{SUPPORTED_TRANSFORMERS}",
            f"pip install 'transformers{SUPPORTED_TRANSFORMERS}' (e.g. energon-pack[hf])",
        )
    if parsed.release[:2] > Version(_NEWEST_TESTED_TRANSFORMERS).release[:2]:
        warnings.warn(
            f"transformers {installed} is newer than the newest release energon_pack.integrations.hf is "
            f"tested with (transformers{SUPPORTED_TRANSFORMERS}); the packed-vs-per-sample parity tests "
            "(tests/integrations/test_integration_hf.py) tell whether it works",
            stacklevel=3,
        )
    _VERSION_CHECKED = installed
    return installed


_PRECOMPUTE_KEYS: dict[str, frozenset[str]] = {}


def vision_precompute_keys(model_type: str) -> frozenset[str]:
    """The precomputed vision tensors (names without the ``image_``/``video_`` prefix) that the installed
    transformers' ``model_type`` tower reads from its kwargs; empty where it reads none.

    Read off the modeling module: ``accepts_precomputed_kwargs`` (``image_cu_seqlens`` -> the tower's
    ``cu_seqlens``) and the ``transformers.vision_utils`` helpers it imports, which take each value
    from the kwargs when given: ``get_vision_position_ids`` (``position_ids``),
    ``get_vision_attention_seqlens`` (``cu_seqlens`` + ``max_seqlen``, and with the window index
    ``max_window_seqlen``) or only ``get_vision_cu_seqlens`` (``cu_seqlens``; ``max_seqlen`` is
    recomputed), ``get_vision_window_index`` (``window_index`` + ``cu_window_seqlens``, Qwen2.5-VL).
    """
    if model_type not in _PRECOMPUTE_KEYS:
        try:
            modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ImportError:
            modeling = None
        keys: set[str] = set()
        if modeling is not None and hasattr(modeling, "accepts_precomputed_kwargs"):
            if hasattr(modeling, "get_vision_position_ids"):
                keys.add("position_ids")
            if hasattr(modeling, "get_vision_attention_seqlens"):
                keys |= {"cu_seqlens", "max_seqlen"}
            elif hasattr(modeling, "get_vision_cu_seqlens"):
                keys.add("cu_seqlens")
            if hasattr(modeling, "get_vision_window_index"):
                keys |= {"window_index", "cu_window_seqlens"}
                if "max_seqlen" in keys:
                    keys.add("max_window_seqlen")
        _PRECOMPUTE_KEYS[model_type] = frozenset(keys)
    return _PRECOMPUTE_KEYS[model_type]
