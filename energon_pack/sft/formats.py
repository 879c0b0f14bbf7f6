"""Record -> (token ids, per-token target mask) for the GPT-SFT JSONL formats.

* :class:`PromptCompletionFormat`: ``[bos] + tok(template(prompt)) + tok(separator + completion)
  + [eos]``; loss on separator + completion + EOS (``loss="completion"``) or everything
  (``"full"``), Megatron-Bridge's ``PromptCompletionSFTPreprocessingConfig`` semantics. The chat
  template is never used. An alpaca record's prompt is its instruction and input, as the chat road
  reads it; a KTO label false is a ``kto_undesirable`` skip, as on the chat road (:func:`_prompt_text`).
* :class:`ChatFormat`: ``messages`` (role/content), ShareGPT ``conversations`` (from/value) or
  LLaMA-Factory records (alpaca ``instruction`` / ``input`` / ``output`` / ``history``; ShareGPT
  with ``function_call`` / ``observation`` turns and ``tools``; see
  :mod:`energon_pack.chat.conversation`) rendered as ChatML by
  :func:`energon_pack.chat.encode_text_chat`, tool calls the Qwen3 way, loss on assistant turns by
  default, no system prompt unless ``system_prompt`` is given (text chat follows no one model's
  template). Preference records are ``preference_data`` skips unless ``preference="chosen"`` trains
  their chosen answer as SFT (:func:`energon_pack.chat.conversation.chosen_as_sft`).

* :class:`TextFormat`: pretraining-style documents (``{"text": ...}``: LLaMA-Factory's ``c4_demo``, TRL's text
  datasets): ``tok(text) + [eos]``, every token supervised, so documents packed together are separated by EOS.

All raise :class:`SampleSkipped` with a reason code for unusable records; text (prompt,
completion, message content) that tokenizes to a control token is ``control_token_in_text``
and text with a lone surrogate ``invalid_text``. The target mask is
*unshifted* (token ``i`` is supervised); the packer shifts it inside each segment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..chat import ENDOFTEXT, LOSS_POLICIES, ChatConfig, as_qwen_tokenizer, encode_text_chat
from ..chat.conversation import KTO_FIELDS, alpaca_prompt, kto_skip
from ..chat.tokenizer import check_text, control_token_ids, reject_control_tokens
from ..errors import ConfigError, SampleSkipped

FORMATS = ("prompt_completion", "chat", "text")
#: the version of the record-reading rules, part of the prompt/completion and chat fingerprints so that lengths and
#: tokens cached under older rules are never reused (2: alpaca prompts, KTO labels as strings and 0/1, TRL records)
RECORD_RULES = 2


@dataclass(frozen=True)
class Encoded:
    """One tokenised record: ids (int64) and the unshifted per-token target mask (bool), same length.

    ``key`` identifies the source (the 1-based line number in a JSONL file).
    """

    input_ids: np.ndarray
    target_mask: np.ndarray
    key: Any = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def truncated(self, max_length: int) -> Encoded:
        return Encoded(self.input_ids[:max_length], self.target_mask[:max_length], self.key)


class SFTFormat(Protocol):
    def encode(self, record: Any) -> Encoded: ...

    def fingerprint(self) -> str: ...


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash identifying the tokenizer's vocabulary and rules (keys the length cache)."""
    inner = getattr(tokenizer, "inner", tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    to_str = getattr(backend, "to_str", None)
    text = (
        to_str()
        if callable(to_str)
        else (
            f"{type(inner).__qualname__}:{getattr(inner, 'name_or_path', '')}:"
            f"{len(getattr(inner, 'get_vocab', dict)())}"
        )
    )
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class PlainTokenizer:
    """Minimal adapter for prompt/completion with a tokenizer lacking the Qwen special tokens
    (e.g. a Llama tokenizer): encode without added specials, pad id = pad, else eos, else 0."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner = tokenizer
        self._raw = hasattr(tokenizer, "encode_batch") and not hasattr(tokenizer, "convert_tokens_to_ids")
        pad = getattr(tokenizer, "pad_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.pad_id = pad if isinstance(pad, int) else eos if isinstance(eos, int) else 0
        self.control_ids = control_token_ids(tokenizer)

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        check_text(text)
        out = self.inner.encode(text, add_special_tokens=False)
        return list(out.ids) if self._raw else list(out)

    def encode_text(self, text: str) -> list[int]:
        ids = self.encode(text)
        reject_control_tokens(ids, self.control_ids, lambda t: self.inner.decode(t, skip_special_tokens=False))
        return ids

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or None when the vocabulary lacks it. HF tokenizers map a missing
        token to the unknown token's id: that is not the token (else a missing EOS trains ``[UNK]``)."""
        if self._raw:
            return self.inner.token_to_id(token)
        tid = self.inner.convert_tokens_to_ids(token)
        if not isinstance(tid, int):
            return None
        unk_id, unk = getattr(self.inner, "unk_token_id", None), getattr(self.inner, "unk_token", None)
        if unk_id is not None and tid == unk_id and token != unk:
            return None
        back = getattr(self.inner, "convert_ids_to_tokens", None)
        if callable(back) and back(tid) != token:
            return None
        return tid


def text_tokenizer(tokenizer: Any) -> Any:
    """The Qwen adapter when the tokenizer has the Qwen special tokens, else :class:`PlainTokenizer`."""
    try:
        return as_qwen_tokenizer(tokenizer)
    except ConfigError:
        return PlainTokenizer(tokenizer)


def ending_eos_id(tok: Any, what: str) -> int:
    """The id that ends ``what`` (a completion, a document): the tokenizer's EOS, else ``<|endoftext|>``."""
    eos = getattr(tok.inner, "eos_token_id", None)
    eos = eos if isinstance(eos, int) else tok.token_to_id(ENDOFTEXT)
    if not isinstance(eos, int):
        raise ConfigError(
            "add_eos",
            f"the tokenizer has no eos_token_id nor <|endoftext|> ({what} would end with no EOS, or with the "
            "unknown token)",
            f"pass eos_id=<the id that ends {what} for your model>, or add_eos=False",
        )
    return eos


def _text_field(record: Mapping, field: str, reason_if_empty: str | None) -> str:
    if field not in record:
        raise SampleSkipped("missing_field", f"no {field!r} field (has {sorted(record)[:8]})")
    value = record[field]
    if isinstance(value, list):
        raise SampleSkipped(
            "missing_field",
            f"field {field!r} is a list (chat turns, as TRL's conversational records hold), not a string: read "
            'such records with format="chat" (--format chat)',
        )
    if not isinstance(value, str):
        raise SampleSkipped("missing_field", f"field {field!r} is {type(value).__name__}, not a string")
    if reason_if_empty and not value.strip():
        raise SampleSkipped(reason_if_empty, f"field {field!r} is empty")
    return value


#: the fields that hold a prompt in the records read here: a record whose prompt field is empty while one of these
#: holds text is a ``prompt_field_mismatch`` skip, never a completion trained with no question
PROMPT_FIELDS = ("prompt", "instruction", "input")
_KTO_KEYS = frozenset(KTO_FIELDS)
#: an alpaca record's prompt fields: with the prompt field one of them, the prompt is :func:`alpaca_prompt`'s
ALPACA_PROMPT_FIELDS = ("instruction", "input")


def _prompt_text(record: Mapping, prompt_field: str) -> str:
    """The prompt of a prompt/completion record. An alpaca record (``instruction`` beside a prompt field of
    :data:`ALPACA_PROMPT_FIELDS`, e.g. the sniffed ``input``) is read as alpaca is (:func:`alpaca_prompt`), its
    ``system`` / ``history`` a ``needs_chat_format`` skip (prompt/completion cannot hold them); an empty prompt
    while another of :data:`PROMPT_FIELDS` holds text is a ``prompt_field_mismatch`` skip."""
    alpaca = "instruction" in record and prompt_field in ALPACA_PROMPT_FIELDS
    if alpaca:
        extra = [k for k in ("system", "history") if record.get(k)]
        if extra:
            raise SampleSkipped(
                "needs_chat_format",
                f"alpaca record with {' and '.join(extra)}: prompt/completion has no system or earlier turns; "
                'read it with format="chat" (--format chat)',
            )
        prompt = alpaca_prompt(record)
    else:
        prompt = _text_field(record, prompt_field, None)
    if not prompt.strip():
        read = ALPACA_PROMPT_FIELDS if alpaca else (prompt_field,)
        other = next(
            (f for f in PROMPT_FIELDS if f not in read and isinstance(record.get(f), str) and record[f].strip()), None
        )
        if other is not None:
            raise SampleSkipped(
                "prompt_field_mismatch",
                f"the prompt field {prompt_field!r} is empty but {other!r} holds text: name the prompt field "
                "(prompt_field=, --prompt-field)",
            )
    return prompt


@dataclass(frozen=True)
class PromptCompletionFormat:
    """Prompt/completion records; ``template`` may use ``{prompt}`` (or the prompt field's name). Alpaca records
    are read as alpaca is and KTO labels by the chat path's one rule (:func:`_prompt_text`,
    :func:`~energon_pack.chat.conversation.kto_skip`)."""

    tokenizer: Any
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    template: str = "{prompt}"
    separator: str = ""
    loss: str = "completion"  # "completion" | "full"
    add_bos: bool = False
    add_eos: bool = True
    strip_whitespace: bool = True
    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if self.loss not in ("completion", "full"):
            raise ConfigError("loss", f"unknown loss {self.loss!r} for prompt/completion", "use 'completion' or 'full'")
        try:
            self.template.format_map({"prompt": "", self.prompt_field: ""})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                "template",
                f"{self.template!r} is not a valid template ({exc!r})",
                f"use only the placeholder {{prompt}} or {{{self.prompt_field}}}",
            ) from None
        tok = text_tokenizer(self.tokenizer)
        object.__setattr__(self, "tokenizer", tok)
        if self.eos_id is None and self.add_eos:
            object.__setattr__(self, "eos_id", ending_eos_id(tok, "a completion"))
        if self.add_bos and self.bos_id is None:
            bos = getattr(tok.inner, "bos_token_id", None)
            if not isinstance(bos, int):
                raise ConfigError("add_bos", "the tokenizer has no bos_token_id", "pass bos_id=... or add_bos=False")
            object.__setattr__(self, "bos_id", bos)

    def encode(self, record: Any) -> Encoded:
        if not isinstance(record, Mapping):
            raise SampleSkipped("missing_field", f"record is {type(record).__name__}, not an object")
        skip = kto_skip(record)  # TRL's unpaired KTO form is a prompt/completion record with a label
        if skip is not None:
            raise skip
        prompt = _prompt_text(record, self.prompt_field)
        completion = _text_field(record, self.completion_field, "empty_completion")
        if self.strip_whitespace:
            prompt, completion = prompt.strip(), completion.strip()
        # prompt and completion are text: a control token typed in them is a counted skip
        prompt_ids = ([self.bos_id] if self.add_bos else []) + self.tokenizer.encode_text(
            self.template.format_map({"prompt": prompt, self.prompt_field: prompt})
        )
        completion_ids = self.tokenizer.encode_text(self.separator + completion) + (
            [self.eos_id] if self.add_eos else []
        )
        ids = np.asarray(prompt_ids + completion_ids, dtype=np.int64)
        mask = np.ones(len(ids), dtype=bool)
        if self.loss == "completion":
            mask[: len(prompt_ids)] = False
        if len(ids) < 2 or not mask[1:].any():
            raise SampleSkipped("no_trained_tokens", "fewer than 2 tokens or no supervised next token")
        return Encoded(ids, mask)

    def plain_prompt(self, record: Mapping) -> str | None:
        """The prompt text :meth:`encode` reads from ``record`` (before stripping), or None when it reads more than
        the prompt field (a KTO label, an alpaca record) or skips the prompt: the length pass counts a record by
        its two texts only where this gives one, and leaves every other to :meth:`encode`."""
        if (type(record) is not dict and not isinstance(record, Mapping)) or not _KTO_KEYS.isdisjoint(record):
            return None
        prompt = record.get(self.prompt_field)
        if type(prompt) is str and prompt.strip() and "instruction" not in record:  # the common case, fast
            return prompt
        try:
            return _prompt_text(record, self.prompt_field)
        except SampleSkipped:
            return None

    def fingerprint(self) -> str:
        knobs = (
            self.prompt_field,
            self.completion_field,
            self.template,
            self.separator,
            self.loss,
            self.add_bos,
            self.add_eos,
            self.strip_whitespace,
            self.bos_id,
            self.eos_id,
            tokenizer_fingerprint(self.tokenizer),
            ("rules", RECORD_RULES),
        )
        return "pc:" + hashlib.blake2b(repr(knobs).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class ChatFormat:
    """Chat records (``messages`` / ``conversations`` / ``conversation``, or alpaca) rendered as ChatML."""

    tokenizer: Any
    loss_policy: str = "assistant"  # "assistant" | "last_turn" | "all"
    system_prompt: str | None = None
    train_newline_after_im_end: bool = False  # Megatron-Bridge's loss rule (ChatConfig)
    preference: str = "refuse"  # "chosen": a preference record's chosen answer trains as SFT (ChatConfig)

    def __post_init__(self) -> None:
        if self.loss_policy not in LOSS_POLICIES:
            raise ConfigError("loss_policy", f"unknown policy {self.loss_policy!r}", f"use one of {LOSS_POLICIES}")
        object.__setattr__(self, "tokenizer", as_qwen_tokenizer(self.tokenizer))
        object.__setattr__(
            self,
            "_config",
            ChatConfig(
                system_prompt=self.system_prompt,
                loss_policy=self.loss_policy,
                train_newline_after_im_end=self.train_newline_after_im_end,
                preference=self.preference,
            ),
        )

    def encode(self, record: Any) -> Encoded:
        input_ids, target = encode_text_chat(record, tokenizer=self.tokenizer, config=self._config)
        return Encoded(input_ids.numpy(), target.numpy())

    def fingerprint(self) -> str:
        knobs = (
            self.loss_policy,
            self.system_prompt,
            self.train_newline_after_im_end,
            tokenizer_fingerprint(self.tokenizer),
            ("rules", RECORD_RULES),
        )
        if self.preference != "refuse":  # the default's fingerprint names no preference mode
            knobs += (("preference", self.preference),)
        return "chat:" + hashlib.blake2b(repr(knobs).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class TextFormat:
    """Pretraining-style documents: ``text_field`` tokenised, EOS appended, every token supervised."""

    tokenizer: Any
    text_field: str = "text"
    add_eos: bool = True
    eos_id: int | None = None

    def __post_init__(self) -> None:
        tok = text_tokenizer(self.tokenizer)
        object.__setattr__(self, "tokenizer", tok)
        if self.eos_id is None and self.add_eos:
            object.__setattr__(self, "eos_id", ending_eos_id(tok, "a document"))

    def encode(self, record: Any) -> Encoded:
        if not isinstance(record, Mapping):
            raise SampleSkipped("missing_field", f"record is {type(record).__name__}, not an object")
        text = _text_field(record, self.text_field, "empty_text")
        ids = np.asarray(self.tokenizer.encode_text(text) + ([self.eos_id] if self.add_eos else []), dtype=np.int64)
        if len(ids) < 2:
            raise SampleSkipped("no_trained_tokens", "fewer than 2 tokens: nothing to predict")
        return Encoded(ids, np.ones(len(ids), dtype=bool))

    def fingerprint(self) -> str:
        knobs = (self.text_field, self.add_eos, self.eos_id, tokenizer_fingerprint(self.tokenizer))
        return "text:" + hashlib.blake2b(repr(knobs).encode(), digest_size=8).hexdigest()


def make_format(format: str, tokenizer: Any, **kw: Any) -> SFTFormat:
    """``"prompt_completion"``, ``"chat"`` or ``"text"`` with its knobs (ConfigError for an unknown one).
    ``tokenizer="demo"`` is the demo tokenizer; ``None`` is too, with a ``DemoTokenizerWarning``."""
    from ..chat.tokenizer import resolve_tokenizer

    tokenizer = resolve_tokenizer(tokenizer, where="make_format")
    if format == "prompt_completion":
        return PromptCompletionFormat(tokenizer, **kw)
    if format == "chat":
        return ChatFormat(tokenizer, **kw)
    if format == "text":
        return TextFormat(tokenizer, **kw)
    raise ConfigError("format", f"unknown format {format!r}", f"use one of {FORMATS}")
