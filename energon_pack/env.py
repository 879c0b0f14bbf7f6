"""Environment variables the package reads or sets for a moment: one spelling of "off" for its
switches, a scoped setting that always restores the caller's value, and where caches live."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

#: values that turn a switch such as ``ENERGON_PACK_PIXEL_KERNELS`` off (case and spaces ignored)
OFF_VALUES = ("off", "0", "false", "no")


#: moves every cache of the package (JSONL line index and lengths, the built Qwen tokenizer, Bridge configs)
CACHE_DIR_VARIABLE = "ENERGON_PACK_CACHE_DIR"


def cache_dir() -> Path:
    """``$ENERGON_PACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/energon_pack``, else ``~/.cache/energon_pack``."""
    if os.environ.get(CACHE_DIR_VARIABLE):
        return Path(os.environ[CACHE_DIR_VARIABLE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "energon_pack"


def switched_off(variable: str) -> bool:
    """True when ``variable`` is set to one of :data:`OFF_VALUES`."""
    return os.environ.get(variable, "").strip().lower() in OFF_VALUES


@contextlib.contextmanager
def environ_set(variable: str, value: str) -> Iterator[None]:
    """``os.environ[variable] = value`` inside the block; the previous value (or its absence) after it."""
    saved = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved
