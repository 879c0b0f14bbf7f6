"""Tokenization through a small protocol that Hugging Face tokenizers satisfy; offline demo tokenizer;
the real Qwen-VL tokenizers by name (built offline in :mod:`energon_pack.chat.qwen_vocab`)."""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, SampleSkipped
from .qwen_vocab import QWEN_VL_TOKENIZER_NAMES, describe_qwen_version, load_qwen_tokenizer_raw

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
QWEN_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)

DEMO_TOKENIZER_ASSET = "qwen_demo_tokenizer.json"
#: ``tokenizer="demo"``: the shipped offline demo tokenizer, asked for by name.
DEMO_TOKENIZER_NAME = "demo"


class DemoTokenizerWarning(UserWarning):
    """No tokenizer was given, so the 773-token offline demo tokenizer is used."""


def demo_tokenizer_message(where: str) -> str:
    return (
        f"{where}: no tokenizer given, so the offline DEMO tokenizer is used (773 tokens, not a real "
        "vocabulary: token counts come out about 3.5x those of a real Qwen tokenizer, so lengths, skips, "
        "packs and fill are not your model's). Fix: pass your model's tokenizer: tokenizer=\"qwen2.5-vl\" "
        '(or "qwen2-vl" / "qwen3-vl": the real Qwen-VL tokenizers, built offline), a Hugging Face tokenizer '
        '(e.g. AutoTokenizer.from_pretrained(<your local model folder>)), or tokenizer="demo" to use the demo '
        "tokenizer on purpose"
    )


def resolve_tokenizer(tokenizer: Any, *, where: str, stacklevel: int = 3, default: str | None = None) -> Any:
    """``"demo"`` -> the demo tokenizer (silently); ``"qwen2-vl" | "qwen2.5-vl" | "qwen3-vl"`` -> that
    model's real tokenizer (offline); ``None`` -> the real tokenizer named by ``default`` when the
    caller knows the model (a Qwen-VL encoder passes its preset's name), else the demo tokenizer with
    a loud :class:`DemoTokenizerWarning` naming it and the fix; anything else is returned as given."""
    if tokenizer is None and default in QWEN_VL_TOKENIZER_NAMES:
        tokenizer = default
    if tokenizer is None:
        warnings.warn(demo_tokenizer_message(where), DemoTokenizerWarning, stacklevel=stacklevel)
        return load_demo_tokenizer()
    if isinstance(tokenizer, str) and tokenizer == DEMO_TOKENIZER_NAME:
        return load_demo_tokenizer()
    if isinstance(tokenizer, str) and tokenizer in QWEN_VL_TOKENIZER_NAMES:
        return load_qwen_tokenizer(tokenizer)
    return tokenizer


def is_demo_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (or the tokenizer it wraps) is the shipped demo tokenizer."""
    while tokenizer is not None:
        if getattr(tokenizer, "_energon_pack_demo", False):
            return True
        tokenizer = getattr(tokenizer, "inner", None)
    return False


def qwen_vocab_version(tokenizer: Any) -> str | None:
    """The Qwen-VL version (``qwen2-vl`` ...) whose real vocabulary this tokenizer is, else None."""
    return getattr(tokenizer, "_energon_pack_qwen_vocab", None)


def describe_tokenizer(tokenizer: Any) -> str:
    """A short human name: ``demo (...)``, ``qwen2.5-vl (Qwen's ... BPE ..., offline)``, the HF
    ``name_or_path``, or the class name."""
    if is_demo_tokenizer(tokenizer):
        return "demo (the 773-token offline demo tokenizer, not a real vocabulary)"
    version = qwen_vocab_version(tokenizer)
    if version is not None:
        return describe_qwen_version(version)
    inner = getattr(tokenizer, "inner", tokenizer)
    name = getattr(inner, "name_or_path", None)
    if isinstance(name, str) and name:
        return name
    return type(inner).__name__


@runtime_checkable
class TokenizerLike(Protocol):
    """What we need from a tokenizer; ``transformers.PreTrainedTokenizerFast`` satisfies it.

    ``encode`` must treat the Qwen special tokens inside ``text`` as single tokens (HF tokenizers
    do for added tokens).
    """

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...


@dataclass(frozen=True)
class SpecialIds:
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    vision_pad: int
    image_pad: int
    video_pad: int
    pad: int  # <|endoftext|> unless the tokenizer names another pad token

    @property
    def skipped(self) -> frozenset[int]:
        """Ids never trained as targets (Bridge's skipped set; <|im_end|> is deliberately trained)."""
        return frozenset(
            {self.im_start, self.vision_start, self.vision_end, self.vision_pad, self.image_pad, self.video_pad}
        )


class QwenTokenizer:
    """Adapter over a :class:`TokenizerLike` (HF tokenizer) or a raw ``tokenizers.Tokenizer``.

    Resolves the Qwen special-token ids once (ConfigError when one is missing or not a single
    token) and memoises text encodings (chat headers repeat in every sample).

    Args:
        tokenizer: a Hugging Face tokenizer or a ``tokenizers.Tokenizer`` holding the Qwen special tokens.
        cache_size: texts whose ids are memoised (LRU, default 4096): chat headers repeat in every sample, and
            post-encode re-tokenises what pre-encode counted a few hundred samples earlier.
    """

    def __init__(self, tokenizer: Any, cache_size: int = 4096) -> None:
        self.inner = tokenizer
        self._is_raw = _is_raw_tokenizers(tokenizer)
        # LRU memo: chat headers repeat in every sample, and post-encode re-tokenizes the pieces
        # that pre-encode counted a few hundred samples earlier.
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_size = cache_size
        if not self._is_raw and not isinstance(tokenizer, TokenizerLike):
            raise ConfigError(
                "tokenizer",
                f"{type(tokenizer).__name__} has no encode/convert_tokens_to_ids",
                "pass a Hugging Face tokenizer or a tokenizers.Tokenizer",
            )
        ids = {}
        for tok in QWEN_SPECIAL_TOKENS:
            tid = self.token_to_id(tok)
            if tid is None or self.encode(tok) != [tid]:
                raise ConfigError(
                    "tokenizer",
                    f"special token {tok!r} is not a single token in this tokenizer",
                    "use a Qwen tokenizer (or load_demo_tokenizer()) with the Qwen special tokens added",
                )
            ids[tok] = tid
        pad = ids[ENDOFTEXT]
        hf_pad = getattr(tokenizer, "pad_token_id", None)
        if isinstance(hf_pad, int):
            pad = hf_pad
        self.special = SpecialIds(
            im_start=ids[IM_START],
            im_end=ids[IM_END],
            vision_start=ids[VISION_START],
            vision_end=ids[VISION_END],
            vision_pad=ids[VISION_PAD],
            image_pad=ids[IMAGE_PAD],
            video_pad=ids[VIDEO_PAD],
            pad=pad,
        )
        #: ids that text must never produce: the Qwen special tokens + the tokenizer's special tokens
        self.control_ids: frozenset[int] = control_token_ids(tokenizer) | frozenset(ids.values())

    @property
    def pad_id(self) -> int:
        return self.special.pad

    def get_vocab_size(self) -> int:
        """Ids the tokenizer can produce, added tokens included."""
        if self._is_raw:
            return self.inner.get_vocab_size(with_added_tokens=True)
        return len(self.inner)

    def token_to_id(self, token: str) -> int | None:
        if self._is_raw:
            return self.inner.token_to_id(token)
        tid = self.inner.convert_tokens_to_ids(token)
        unk = getattr(self.inner, "unk_token_id", None)
        return (
            None
            if tid is None or (unk is not None and tid == unk and token != getattr(self.inner, "unk_token", None))
            else tid
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added (special tokens in the text are recognised)."""
        if not text:
            return []
        cache = self._cache
        hit = cache.get(text)
        if hit is not None:
            cache.move_to_end(text)
            return list(hit)
        check_text(text)
        if self._is_raw:
            ids = self.inner.encode(text, add_special_tokens=False).ids
        else:
            ids = self.inner.encode(text, add_special_tokens=False)
        if self._cache_size:
            cache[text] = tuple(ids)
            if len(cache) > self._cache_size:
                cache.popitem(last=False)  # least recently used
        return list(ids)

    def encode_text(self, text: str) -> list[int]:
        """Ids of user/assistant/system *text*: SampleSkipped("control_token_in_text") when it
        produces a control token (a typed ``<|image_pad|>``, ``<|im_end|>``, ...)."""
        ids = self.encode(text)
        reject_control_tokens(ids, self.control_ids, self.decode)
        return ids

    @functools.cached_property
    def added_token_pattern(self) -> re.Pattern | None:
        """A pattern matching the tokenizer's added tokens (longest first), which HF tokenizers split out of
        the text before any other step: text between two of them tokenises on its own. None: no added tokens."""
        backend = self.inner if self._is_raw else getattr(self.inner, "backend_tokenizer", None)
        decoder = getattr(self.inner, "added_tokens_decoder", None)
        if not isinstance(decoder, dict) and backend is not None:
            decoder = backend.get_added_tokens_decoder()
        texts = {getattr(t, "content", None) for t in decoder.values()} if isinstance(decoder, dict) else set()
        texts = sorted((t for t in texts if isinstance(t, str) and t), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    def decode(self, ids: list[int]) -> str:
        if self._is_raw:
            return self.inner.decode(list(ids), skip_special_tokens=False)
        return self.inner.decode(list(ids), skip_special_tokens=False)


def check_text(text: str) -> None:
    """SampleSkipped("invalid_text") for a string that is not valid Unicode text (a lone surrogate
    such as JSON's ``"\\ud800"``: tokenizers refuse it with a TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleSkipped(
            "invalid_text", f"not encodable as UTF-8 ({exc.reason} at {exc.start}: {text[exc.start : exc.end]!r})"
        ) from None


def control_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (special added tokens, HF ``all_special_ids``), minus
    the unknown token (ordinary text may legitimately map to it). Non-special added tokens (e.g.
    Qwen's ``<tool_call>``, ``<think>``) are text that templates write, so they are allowed."""
    ids: set[int] = set()
    if _is_raw_tokenizers(tokenizer):
        ids.update(tid for tid, tok in tokenizer.get_added_tokens_decoder().items() if tok.special)
        return frozenset(ids)
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        ids.update(tid for tid, tok in decoder.items() if getattr(tok, "special", False))
    special = getattr(tokenizer, "all_special_ids", None)
    if isinstance(special, (list, tuple, set, frozenset)):
        ids.update(int(t) for t in special if isinstance(t, int))
    unk = getattr(tokenizer, "unk_token_id", None)
    ids.discard(unk)
    return frozenset(ids)


def reject_control_tokens(ids: list[int], control_ids: frozenset[int], decode: Any = None) -> None:
    """SampleSkipped("control_token_in_text") when text tokenized to a control token."""
    if not control_ids or control_ids.isdisjoint(ids):
        return
    bad = next(t for t in ids if t in control_ids)
    name = decode([bad]) if decode is not None else str(bad)
    raise SampleSkipped(
        "control_token_in_text",
        f"text contains the control token {name!r} (id {bad}); text never produces control tokens",
    )


def _is_raw_tokenizers(obj: Any) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, Tokenizer)


def as_qwen_tokenizer(tokenizer: Any) -> QwenTokenizer:
    return tokenizer if isinstance(tokenizer, QwenTokenizer) else QwenTokenizer(tokenizer)


def load_demo_tokenizer_raw():
    """The shipped demo ``tokenizers.Tokenizer`` (byte-level BPE, Qwen split regex, Qwen special tokens)."""
    from tokenizers import Tokenizer

    text = resources.files("energon_pack").joinpath("assets", DEMO_TOKENIZER_ASSET).read_text(encoding="utf-8")
    return Tokenizer.from_str(text)


def load_demo_tokenizer() -> QwenTokenizer:
    """A small offline tokenizer for demos and tests (not Qwen's vocabulary; never downloads)."""
    tok = QwenTokenizer(load_demo_tokenizer_raw())
    tok._energon_pack_demo = True
    return tok


def load_qwen_tokenizer(version: str, *, cache_dir: str | os.PathLike | None = None) -> QwenTokenizer:
    """Our :class:`QwenTokenizer` adapter over the real ``version`` tokenizer (never downloads).

    Args:
        version: ``"qwen2-vl"``, ``"qwen2.5-vl"`` or ``"qwen3-vl"`` (:data:`QWEN_VL_TOKENIZER_NAMES`).
        cache_dir: where the built BPE is cached as JSON; None: the user cache dir (building it takes seconds).
    """
    tok = QwenTokenizer(load_qwen_tokenizer_raw(version, cache_dir=cache_dir))
    tok._energon_pack_qwen_vocab = version
    return tok


def load_tokenizer(spec: Any = None, *, where: str = "tokenizer", stacklevel: int = 3) -> Any:
    """A tokenizer from what a user names: ``"demo"`` (the shipped demo tokenizer), ``None`` (the
    same, with a :class:`DemoTokenizerWarning`), ``"qwen2-vl" | "qwen2.5-vl" | "qwen3-vl"`` (that
    model's real tokenizer, built offline), a ``tokenizer.json`` file, a local Hugging Face
    tokenizer folder (never downloads), or a tokenizer object (returned as is).

    A path that holds no loadable tokenizer raises :class:`ConfigError` naming the fix.

    Args:
        spec: the tokenizer, as above (default None: the demo tokenizer, with a warning).
        where: who asks, named in the :class:`DemoTokenizerWarning` (e.g. ``"JsonlSFTDataset"``).
        stacklevel: the frame that warning points at (default 3: the caller of the function that calls this).
    """
    from pathlib import Path

    if spec is None or spec == DEMO_TOKENIZER_NAME or spec in QWEN_VL_TOKENIZER_NAMES:
        return resolve_tokenizer(spec, where=where, stacklevel=stacklevel + 1)
    if not isinstance(spec, (str, os.PathLike)):
        return spec
    path = Path(spec)
    if path.is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises its own Exception type
            raise ConfigError(
                "tokenizer",
                f"{path} is not a tokenizers JSON file ({str(exc).splitlines()[0][:120]})",
                "pass a tokenizer.json or a local Hugging Face tokenizer folder",
            ) from None
    if path.is_dir():
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError(
                "tokenizer",
                f"{path} is a folder, and loading it needs transformers",
                "pip install transformers, or pass its tokenizer.json file",
            ) from None
        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/... for unusable folders
            raise ConfigError(
                "tokenizer",
                f"no tokenizer could be loaded from {path} ({str(exc).splitlines()[0][:120]})",
                "pass a folder with tokenizer files or a tokenizer.json",
            ) from None
    raise ConfigError(
        "tokenizer",
        f"{spec}: no such file or folder",
        "pass a tokenizer.json or a local Hugging Face tokenizer folder (nothing is downloaded), "
        f"one of {', '.join(QWEN_VL_TOKENIZER_NAMES)} for a real Qwen-VL tokenizer, "
        'or "demo" for the demo tokenizer',
    )
