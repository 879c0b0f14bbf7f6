"""A lower bound on a text's token count from its UTF-8 length, for byte-level BPE tokenizers.

With byte-level BPE every token stands for a run of the (normalised) text's bytes, one byte per
character of its vocabulary string (an added token stands for its own content's UTF-8). So a
text of ``B`` bytes has at least ``ceil(B / L)`` tokens, ``L`` the longest such run, when nothing can
stand for more (no fused unknown tokens, no added token that swallows whitespace), nothing drops
bytes (the pre-tokenizer only splits) and the normaliser does not shrink the text (none), or
shrinks it at most :data:`NFC_SHRINK` times (NFC). The GPT-SFT length pass calls a huge line
``too_long`` without tokenising it (the tokenizer holds ~170 bytes per input byte), and the chat
renderer stops a sample whose text outgrows ``max_length`` the same way.
"""

from __future__ import annotations

import json
from typing import Any

from .tokenizer import QwenTokenizer, _is_raw_tokenizers

#: NFC shrinks UTF-8 at most 3x (U+0390 is 6 bytes decomposed, 2 composed; Hangul LVT 9 -> 3)
NFC_SHRINK = 3
_SPLITTING = {"Split", "Digits", "Punctuation"}  # pre-tokenizers that only cut (unless "Removed")


def backend(tokenizer: Any) -> Any | None:
    """The raw ``tokenizers.Tokenizer`` behind an adapter / Hugging Face fast tokenizer, or None."""
    inner = getattr(tokenizer, "inner", tokenizer)
    if not _is_raw_tokenizers(inner) and getattr(inner, "is_fast", False):
        inner = getattr(inner, "backend_tokenizer", None)
    return inner if _is_raw_tokenizers(inner) else None


def _keeps_every_byte(pre: dict | None) -> bool:
    """True when the pre-tokenizer (its JSON) is byte-level and only splits the text."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") if step else None for step in steps]
    return "ByteLevel" in kinds and all(
        kind == "ByteLevel" or (kind in _SPLITTING and step.get("behavior", "Isolated") != "Removed")
        for kind, step in zip(kinds, steps)
    )


def max_bytes_per_token(tokenizer: Any) -> int | None:
    """``L`` above times the normaliser's shrink factor: every token stands for at most this many
    UTF-8 bytes of the text; None when the tokenizer's structure gives no such bound."""
    inner = backend(tokenizer)
    if inner is None:
        return None
    model = inner.model
    if type(model).__name__ != "BPE" or (model.unk_token and model.fuse_unk):
        return None
    norm = inner.normalizer
    shrink = 1 if norm is None else NFC_SHRINK if type(norm).__name__ == "NFC" else None
    pre = inner.pre_tokenizer
    if shrink is None or pre is None or not _keeps_every_byte(json.loads(pre.__getstate__())):
        return None
    if any(tok.lstrip or tok.rstrip for tok in inner.get_added_tokens_decoder().values()):
        return None  # such a token also stands for the whitespace next to it, however long
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = set(ByteLevel.alphabet())
    vocab = inner.get_vocab(with_added_tokens=False)
    if not alphabet <= vocab.keys():
        return None  # a byte missing from the vocabulary is dropped: not every byte is covered
    # a byte-level character is one byte of text (anything else: its UTF-8, more than it can stand for)
    longest = max(sum(1 if ch in alphabet else len(ch.encode("utf-8")) for ch in token) for token in vocab)
    added = (len(tok.content.encode("utf-8")) for tok in inner.get_added_tokens_decoder().values())
    return shrink * max([longest, *added])


def cached_max_bytes_per_token(tok: QwenTokenizer) -> int | None:
    """:func:`max_bytes_per_token` of an adapter, computed once (it reads the whole vocabulary)."""
    if "_max_bytes_per_token" not in tok.__dict__:
        tok._max_bytes_per_token = max_bytes_per_token(tok)
    return tok._max_bytes_per_token
