"""Model-neutral chat: conversation shapes, ChatML rendering, loss policies, the tokenizer
protocol and the official templates' prompt defaults. The Qwen-VL path (vision blocks,
M-RoPE) and the GPT-SFT path both build on it.

Every name is imported on first use (PEP 562): :mod:`.conversation` (what ``energon-pack convert``
checks records with) loads without torch or a tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from energon_pack.lazy_exports import lazy_exports

#: public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "ROLE_ALIASES": ".conversation",
    "Conversation": ".conversation",
    "Message": ".conversation",
    "normalize_conversation": ".conversation",
    "place_media": ".conversation",
    "require_assistant_turn": ".conversation",
    "QWEN_VL_LARGE_VOCAB_ROWS": ".qwen_vocab",
    "QWEN_VL_VOCAB_ROWS": ".qwen_vocab",
    "QwenTokenizerCacheWarning": ".qwen_vocab",
    "load_qwen_hf_tokenizer": ".qwen_vocab",
    "load_qwen_tokenizer_raw": ".qwen_vocab",
    "LOSS_POLICIES": ".render",
    "ChatConfig": ".render",
    "ChatMLBuilder": ".render",
    "encode_text_chat": ".render",
    "render_chat": ".render",
    "TEMPLATE_DEFAULT": ".templates",
    "TEMPLATE_SYSTEM_PROMPTS": ".templates",
    "TEMPLATE_TOOL_SUPPORT": ".templates",
    "template_supports_tools": ".templates",
    "template_system_prompt": ".templates",
    "DEMO_TOKENIZER_NAME": ".tokenizer",
    "ENDOFTEXT": ".tokenizer",
    "QWEN_SPECIAL_TOKENS": ".tokenizer",
    "QWEN_VL_TOKENIZER_NAMES": ".tokenizer",
    "DemoTokenizerWarning": ".tokenizer",
    "QwenTokenizer": ".tokenizer",
    "SpecialIds": ".tokenizer",
    "TokenizerLike": ".tokenizer",
    "as_qwen_tokenizer": ".tokenizer",
    "describe_tokenizer": ".tokenizer",
    "load_demo_tokenizer": ".tokenizer",
    "load_demo_tokenizer_raw": ".tokenizer",
    "load_qwen_tokenizer": ".tokenizer",
    "load_tokenizer": ".tokenizer",
    "resolve_tokenizer": ".tokenizer",
}

#: the same names as :data:`_EXPORTS` (a literal, so linters see the re-exports below)
__all__ = [
    "DEMO_TOKENIZER_NAME",
    "DemoTokenizerWarning",
    "describe_tokenizer",
    "resolve_tokenizer",
    "ENDOFTEXT",
    "LOSS_POLICIES",
    "QWEN_SPECIAL_TOKENS",
    "ROLE_ALIASES",
    "TEMPLATE_DEFAULT",
    "TEMPLATE_SYSTEM_PROMPTS",
    "TEMPLATE_TOOL_SUPPORT",
    "ChatConfig",
    "ChatMLBuilder",
    "Conversation",
    "Message",
    "QwenTokenizer",
    "SpecialIds",
    "TokenizerLike",
    "as_qwen_tokenizer",
    "encode_text_chat",
    "load_demo_tokenizer",
    "load_demo_tokenizer_raw",
    "normalize_conversation",
    "place_media",
    "render_chat",
    "require_assistant_turn",
    "template_supports_tools",
    "template_system_prompt",
    "QWEN_VL_TOKENIZER_NAMES",
    "QWEN_VL_VOCAB_ROWS",
    "QWEN_VL_LARGE_VOCAB_ROWS",
    "QwenTokenizerCacheWarning",
    "load_qwen_tokenizer",
    "load_qwen_tokenizer_raw",
    "load_qwen_hf_tokenizer",
    "load_tokenizer",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # static analysers see the real names(``X``: re-exported)
    from .conversation import (
        ROLE_ALIASES,
        Conversation,
        Message,
        normalize_conversation,
        place_media,
        require_assistant_turn,
    )
    from .qwen_vocab import (
        QWEN_VL_LARGE_VOCAB_ROWS,
        QWEN_VL_VOCAB_ROWS,
        QwenTokenizerCacheWarning,
        load_qwen_hf_tokenizer,
        load_qwen_tokenizer_raw,
    )
    from .render import (
        LOSS_POLICIES,
        ChatConfig,
        ChatMLBuilder,
        encode_text_chat,
        render_chat,
    )
    from .templates import (
        TEMPLATE_DEFAULT,
        TEMPLATE_SYSTEM_PROMPTS,
        TEMPLATE_TOOL_SUPPORT,
        template_supports_tools,
        template_system_prompt,
    )
    from .tokenizer import (
        DEMO_TOKENIZER_NAME,
        ENDOFTEXT,
        QWEN_SPECIAL_TOKENS,
        QWEN_VL_TOKENIZER_NAMES,
        DemoTokenizerWarning,
        QwenTokenizer,
        SpecialIds,
        TokenizerLike,
        as_qwen_tokenizer,
        describe_tokenizer,
        load_demo_tokenizer,
        load_demo_tokenizer_raw,
        load_qwen_tokenizer,
        load_tokenizer,
        resolve_tokenizer,
    )
