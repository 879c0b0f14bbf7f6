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


#: Whether each official template renders tools, tool calls and tool turns. The Qwen2-VL and
#: Qwen2.5-VL Instruct templates have no tool handling (tool calls would be dropped and ``tool``
#: kept as a literal role): such conversations are a counted ``tool_calls_unsupported`` skip.
TEMPLATE_TOOL_SUPPORT: dict[str, bool] = {"qwen2-vl": False, "qwen2.5-vl": False, "qwen3-vl": True}
_ROPE_STYLE_FAMILY = {"qwen2": "qwen2-vl", "qwen2.5": "qwen2.5-vl", "qwen3": "qwen3-vl"}


def template_supports_tools(family: str, rope_style: str | None = None) -> bool:
    """Whether ``family``'s official template renders tool calls (a preset with a custom name is
    looked up by its ``rope_style``)."""
    if family in TEMPLATE_TOOL_SUPPORT:
        return TEMPLATE_TOOL_SUPPORT[family]
    return TEMPLATE_TOOL_SUPPORT.get(_ROPE_STYLE_FAMILY.get(rope_style or "", ""), False)


class _TemplateDefault(enum.Enum):
    TEMPLATE = "the model family's official template default"

    def __repr__(self) -> str:
        return "TEMPLATE_DEFAULT"


#: ``ChatConfig(system_prompt=TEMPLATE_DEFAULT)`` (the default): use the template's own default.
TEMPLATE_DEFAULT = _TemplateDefault.TEMPLATE


def template_system_prompt(family: str) -> str | None:
    """The default system prompt of ``family``'s official template (None for an unknown family)."""
    return TEMPLATE_SYSTEM_PROMPTS.get(family)
