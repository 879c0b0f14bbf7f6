"""Prompt-format defaults of the official chat templates, per model family.

The official Qwen2-VL and Qwen2.5-VL Instruct templates insert
``<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n`` when a conversation has no
system turn; the Qwen3-VL Instruct template inserts none. A model finetuned without that turn
is later served prompts it never saw, so the template's default is our default too.
:class:`~energon_pack.chat.ChatConfig` overrides it (``system_prompt=None`` for none).
"""

from __future__ import annotations

import enum

#: The system prompt each official template inserts when a conversation has none.
TEMPLATE_SYSTEM_PROMPTS: dict[str, str | None] = {
    "qwen2-vl": "You are a helpful assistant.",
    "qwen2.5-vl": "You are a helpful assistant.",
    "qwen3-vl": None,
}


class _TemplateDefault(enum.Enum):
    TEMPLATE = "the model family's official template default"

    def __repr__(self) -> str:
        return "TEMPLATE_DEFAULT"


#: ``ChatConfig(system_prompt=TEMPLATE_DEFAULT)`` (the default): use the template's own default.
TEMPLATE_DEFAULT = _TemplateDefault.TEMPLATE


def template_system_prompt(family: str) -> str | None:
    """The default system prompt of ``family``'s official template (None for an unknown family)."""
    return TEMPLATE_SYSTEM_PROMPTS.get(family)
