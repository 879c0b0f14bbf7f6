"""Model-neutral chat: conversation shapes, ChatML rendering, loss policies, the tokenizer
protocol and the official templates' prompt defaults. The Qwen-VL path (vision blocks,
M-RoPE) and the GPT-SFT path both build on it."""

from .conversation import ROLE_ALIASES, Conversation, Message, normalize_conversation, place_media, require_assistant_turn
from .render import LOSS_POLICIES, ChatConfig, ChatMLBuilder, encode_text_chat, render_chat
from .templates import (
    TEMPLATE_DEFAULT,
    TEMPLATE_SYSTEM_PROMPTS,
    TEMPLATE_TOOL_SUPPORT,
    template_supports_tools,
    template_system_prompt,
)
from .qwen_vocab import (
    QWEN_VL_LARGE_VOCAB_ROWS,
    QWEN_VL_VOCAB_ROWS,
    QwenTokenizerCacheWarning,
    load_qwen_hf_tokenizer,
    load_qwen_tokenizer_raw,
)
from .tokenizer import (
    DEMO_TOKENIZER_NAME,
    QWEN_VL_TOKENIZER_NAMES,
    ENDOFTEXT,
    DemoTokenizerWarning,
    QWEN_SPECIAL_TOKENS,
    QwenTokenizer,
    SpecialIds,
    TokenizerLike,
    as_qwen_tokenizer,
    load_demo_tokenizer,
    load_demo_tokenizer_raw,
    load_qwen_tokenizer,
    describe_tokenizer,
    load_tokenizer,
    resolve_tokenizer,
)

__all__ = [
    "DEMO_TOKENIZER_NAME", "DemoTokenizerWarning", "describe_tokenizer", "resolve_tokenizer", "ENDOFTEXT", "LOSS_POLICIES", "QWEN_SPECIAL_TOKENS", "ROLE_ALIASES", "TEMPLATE_DEFAULT", "TEMPLATE_SYSTEM_PROMPTS",
    "TEMPLATE_TOOL_SUPPORT", "ChatConfig", "ChatMLBuilder", "Conversation", "Message", "QwenTokenizer", "SpecialIds", "TokenizerLike", "as_qwen_tokenizer",
    "encode_text_chat", "load_demo_tokenizer", "load_demo_tokenizer_raw", "normalize_conversation", "place_media",
    "render_chat", "require_assistant_turn", "template_supports_tools", "template_system_prompt",
    "QWEN_VL_TOKENIZER_NAMES", "QWEN_VL_VOCAB_ROWS", "QWEN_VL_LARGE_VOCAB_ROWS", "QwenTokenizerCacheWarning",
    "load_qwen_tokenizer", "load_qwen_tokenizer_raw", "load_qwen_hf_tokenizer", "load_tokenizer",
]
