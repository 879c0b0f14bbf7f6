"""Old home of Megatron-Bridge's GPT-SFT road, kept so ``energon_pack.integrations.bridge_sft`` imports keep
working: it all lives in :mod:`energon_pack.integrations.bridge` (its ``gpt_sft`` module), read through here."""

from __future__ import annotations

from typing import Any

from . import bridge as _bridge


def __getattr__(name: str) -> Any:
    return getattr(_bridge, name)
