"""A lower bound on a text's token count from its UTF-8 length, for byte-level BPE tokenizers.

With byte-level BPE every token stands for a run of the (normalised) text's bytes, one byte per
character of its vocabulary string (an added token stands for its own content's UTF-8). So a
text of ``B`` bytes has at least ``ceil(B / L)`` tokens, ``L`` the longest such run, when nothing can
stand for more (no fused unknown tokens, no added token that swallows whitespace), nothing drops
bytes (the pre-tokenizer only splits) and the normaliser does not shrink the text (none), or
shrinks it at most :data:`NFC_SHRINK` times (NFC). The length pass uses it to call a huge line
``too_long`` without tokenising it (the tokenizer holds ~170 bytes per input byte). The bound itself
lives in :mod:`energon_pack.chat.token_bound` (the chat renderer uses it too); this adds the chat texts.
"""

from __future__ import annotations

from typing import Any

from ..chat.token_bound import NFC_SHRINK, backend, max_bytes_per_token

__all__ = ["NFC_SHRINK", "backend", "chat_texts", "max_bytes_per_token"]


def chat_texts(record: Any, control_contents: tuple[str, ...], preference: str = "refuse") -> list[str] | None:
    """The message texts a chat record renders at least (each stripped, and after its last
    ``</think>``: a template may drop either), or None when the chat format would skip the record
    for another reason first (its shape, no assistant turn, media, tools, a typed control token).
    ``preference``: the chat format's (a preference record read as its chosen answer with ``"chosen"``)."""
    from ..chat.conversation import normalize_conversation, place_media, require_assistant_turn
    from ..errors import SampleSkipped

    try:
        messages = normalize_conversation(record, preference=preference)
        require_assistant_turn(messages)
        place_media(messages, 0, 0)
    except SampleSkipped:
        return None
    if messages.uses_tools:
        return None
    texts = [payload for m in messages for kind, payload in m.parts if kind == "text"]
    if any(c in text for text in texts for c in control_contents):
        return None
    return [text.rsplit("</think>", 1)[-1].strip() for text in texts]
