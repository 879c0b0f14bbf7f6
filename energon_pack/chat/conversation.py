"""Conversations in the shapes users store them -> a list of :class:`Message` with media parts.

Accepted: ``[{"role", "content"}]`` (content a string or a list of OpenAI/HF-style parts),
LLaVA/ShareGPT ``[{"from", "value"}]``, a dict wrapping ``messages`` / ``conversations`` /
``conversation`` (JSON strings accepted; a ``system`` string beside them is the system turn when
the turns have none, as in LLaMA-Factory's ShareGPT files), a LLaMA-Factory alpaca record
(:func:`alpaca_turns`) or a TRL conversational prompt/completion record (:func:`prompt_completion_turns`; its
strings form is prompt/completion data, not chat). ``<image>`` / ``<video>`` in text are placeholders. Every
unusable shape raises :class:`~energon_pack.errors.SampleSkipped` with a reason; a role other than system / user
/ assistant / tool (after :data:`ROLE_ALIASES`) is ``unknown_role``, never a literal turn.
Preference records (DPO/ORPO/reward ``chosen``/``rejected``, LLaMA-Factory ranking) are a ``preference_data``
skip unless ``preference="chosen"`` asks to train their chosen answer as SFT (:func:`chosen_as_sft`). A KTO label
(LLaMA-Factory ``kto_tag``, TRL ``label``) is read by one rule on every road (:func:`kto_label`): false is a
``kto_undesirable`` skip, a value it cannot read a ``kto_label_unreadable`` skip, true trains as SFT.

Tool calls from every accepted format end in one shape: an assistant turn's
:attr:`Message.tool_calls`, role ``tool`` for results, :attr:`Conversation.tools` for the
signatures. Sources: OpenAI ``tool_calls`` (``content`` may be ``null``) and ``role: "tool"``;
LLaMA-Factory / ShareGPT ``function_call`` turns (a JSON ``{"name", "arguments"}`` or a list of
them) and ``observation`` turns; ``tools`` as a list or as its JSON text. A bare signature
(``{"name", "parameters"}``, no ``type``) is wrapped as ``{"type": "function", "function": ...}``,
the OpenAI shape that serving stacks pass to the template (LLaMA-Factory's Qwen formatter does the
same). The renderer decides what a template does with them (:func:`energon_pack.chat.render_chat`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, SampleSkipped
from ..records import check_depth, loads_checked

ROLE_ALIASES = {
    "human": "user",
    "gpt": "assistant",
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_call": "assistant",
}
#: The roles a turn may have after aliasing; any other is a counted ``unknown_role`` skip.
ROLES = ("system", "user", "assistant", "tool")
#: Source roles whose content is the turn's tool calls (LLaMA-Factory / ShareGPT), not text.
CALL_ROLES = ("function_call",)
#: The fields of a LLaMA-Factory alpaca record (:func:`alpaca_turns`).
ALPACA_FIELDS = ("instruction", "input", "output", "system", "history")
_PLACEHOLDER = re.compile(r"<image>|<video>")
#: LLaMA-Factory's audio placeholder: a record holding one trains no audio here, so it is skipped, never trained as text
_AUDIO_PLACEHOLDER = "<audio>"
#: record fields of data that is not supervised finetuning, and content parts of modalities not trained here
AUDIO_FIELDS = ("audios", "audio")
PREFERENCE_FIELDS = ("chosen", "rejected")
#: what a preference record (chosen/rejected, LLaMA-Factory ranking) becomes: ``"refuse"`` (default) a counted
#: ``preference_data`` skip; ``"chosen"`` the SFT record of its prompt and chosen answer (:func:`chosen_as_sft`)
PREFERENCE_MODES = ("refuse", "chosen")
_CHOSEN_OPTION = 'preference="chosen" (--preference chosen)'  # how a preference skip names the option
#: the fields of a preference pair, dropped from the SFT record of its chosen answer
_PAIR_FIELDS = ("chosen", "rejected", "prompt")
_TURN_KEYS = ("messages", "conversations", "conversation")
#: the fields of a KTO label: LLaMA-Factory's ``kto_tag``, TRL's ``label`` (read by :func:`kto_label`)
KTO_FIELDS = ("kto_tag", "label")
#: the words a KTO label may be written as (case and surrounding blanks aside), and what each says
_KTO_WORDS = {"true": True, "1": True, "false": False, "0": False}
AUDIO_PART_TYPES = ("audio", "input_audio", "audio_url")


def not_sft_reason(record: Mapping) -> SampleSkipped | None:
    """The skip for a record that is not plain SFT data of the modalities trained here, else None: audio (LLaMA-Factory
    ``audios``), preference pairs (``chosen``/``rejected``: DPO/ORPO/reward data, LLaMA-Factory ``ranking``, TRL), or a
    KTO example labelled undesirable or with an unreadable label (:func:`kto_skip`). A KTO example labelled desirable
    is an SFT example and trains as one."""
    audio = next((k for k in AUDIO_FIELDS if record.get(k)), None)
    if audio is not None:
        return SampleSkipped(
            "unsupported_audio", f"the record holds {audio!r}: audio is not trained here (images, videos and text are)"
        )
    if all(k in record for k in PREFERENCE_FIELDS):
        return SampleSkipped(
            "preference_data",
            "chosen/rejected: a DPO/ORPO/reward-model pair, not SFT; train it with a DPO/ORPO/reward trainer, "
            f"or train its chosen answer as SFT with {_CHOSEN_OPTION}",
        )
    if isinstance(record.get("output"), list) and "instruction" in record:
        return SampleSkipped(
            "preference_data",
            f"alpaca output is a list: LLaMA-Factory ranking (pairwise) data, not SFT; {_CHOSEN_OPTION} trains "
            "output[0] (the chosen answer) as SFT",
        )
    return kto_skip(record)


def kto_label(field: str, value: Any) -> bool | None:
    """One KTO label as desirable (True) / undesirable (False); None when absent (``None``). Read: a bool, the ints
    0 / 1 and the strings ``"true"`` / ``"false"`` / ``"1"`` / ``"0"`` in any case (what CSV, Parquet and
    hand-written JSON store). Any other value is a ``kto_label_unreadable`` skip naming it: guessed, an undesirable
    answer could be trained."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _KTO_WORDS:
        return _KTO_WORDS[value.strip().lower()]
    raise SampleSkipped(
        "kto_label_unreadable",
        f"KTO {field} is {_short(value)}: a KTO label is true/false (or 1/0, 'true'/'false'); fix the value, or "
        f"rename the field if it is not a KTO label ({' / '.join(KTO_FIELDS)} are read as one)",
    )


def kto_skip(record: Mapping) -> SampleSkipped | None:
    """The skip of a record whose KTO label (any of :data:`KTO_FIELDS`, read by :func:`kto_label`) says
    undesirable or cannot be read, else None: the one KTO rule of every path (chat, prompt/completion, convert)."""
    for field in KTO_FIELDS:
        try:
            label = kto_label(field, record.get(field))
        except SampleSkipped as skip:
            return skip
        if label is False:
            return SampleSkipped(
                "kto_undesirable",
                f"KTO {field} is {_short(record[field])}: an undesirable answer, never trained as SFT",
            )
    return None


def check_preference(preference: Any) -> str:
    """``preference`` when it is one of :data:`PREFERENCE_MODES`, else a ConfigError naming the knob."""
    if not isinstance(preference, str) or preference not in PREFERENCE_MODES:
        raise ConfigError(
            "preference",
            f"unknown mode {preference!r}",
            f"use one of {PREFERENCE_MODES} (refuse: chosen/rejected pairs are counted skips; chosen: their chosen "
            "answers train as SFT)",
        )
    return preference


def chosen_as_sft(record: Any) -> Any:
    """A preference record as the SFT record of its prompt and chosen answer; any other record unchanged.

    Read: LLaMA-Factory ShareGPT pairwise (``conversations`` / ``messages`` prompt turns, ``chosen`` one turn or a
    list of turns), LLaMA-Factory alpaca pairwise (``instruction`` / ``input``, ``chosen`` a string) and its ranking
    form (``output: [chosen, rejected]``), TRL explicit prompt (``prompt`` a string or turns, ``chosen`` a string or
    assistant turns) and TRL implicit prompt (``chosen`` the whole conversation's turns). Other fields (images,
    videos, system, tools) are kept; ``chosen``, ``rejected`` and ``prompt`` are dropped. A pair of a shape not read
    here stays a ``preference_data`` skip naming what it holds."""
    if not isinstance(record, Mapping):
        return record
    if "instruction" in record and isinstance(record.get("output"), list) and "chosen" not in record:
        ranked = record["output"]
        if not ranked or not isinstance(ranked[0], str):
            raise _unread_pair(f"alpaca ranking output {_short(ranked)}: its first item (the chosen) is no string")
        return {**record, "output": ranked[0]}
    if not all(k in record for k in PREFERENCE_FIELDS):
        return record
    chosen = record["chosen"]
    rest = {k: v for k, v in record.items() if k not in _PAIR_FIELDS}
    key = next((k for k in _TURN_KEYS if k in record), None)
    if key is not None:  # LLaMA-Factory ShareGPT pairwise: the prompt's turns, then the chosen turn(s)
        prompt = record[key]
        if isinstance(prompt, str):
            prompt = _json_value(prompt, key)
        if not isinstance(prompt, list):
            raise _unread_pair(f"{key} is {type(prompt).__name__}, not a list of turns")
        style = "from" if any(isinstance(t, Mapping) and "from" in t for t in prompt) else "role"
        return {**rest, key: [*prompt, *_answer_turns(chosen, style)]}
    if "instruction" in record:  # LLaMA-Factory alpaca pairwise
        if not isinstance(chosen, str):
            raise _unread_pair(f"alpaca chosen is {type(chosen).__name__}, not a string")
        return {**rest, "output": chosen}
    if "prompt" in record:  # TRL explicit prompt: a string (one user turn) or turns
        prompt = _as_turns(record["prompt"], "role", "user")
        if prompt is None:
            raise _unread_pair(f"prompt is {type(record['prompt']).__name__}, not a string or a list of turns")
        return {**rest, "messages": [*prompt, *_answer_turns(chosen, "role")]}
    if isinstance(chosen, list) and all(isinstance(t, Mapping) for t in chosen):  # TRL implicit prompt
        return {**rest, "messages": list(chosen)}
    raise _unread_pair(
        f"chosen is {type(chosen).__name__} with no prompt, conversations/messages or instruction beside it "
        f"(keys {sorted(record)[:8]})"
    )


def _as_turns(value: Any, style: str, role: str) -> list | None:
    """A string as one ``role`` turn (``from``/``value`` or ``role``/``content``, as the record's other turns are
    written), a non-empty list of turns as it is; None for anything else."""
    if isinstance(value, str):
        source = {"user": "human", "assistant": "gpt"}[role]
        return [{"from": source, "value": value} if style == "from" else {"role": role, "content": value}]
    if isinstance(value, list) and value and all(isinstance(t, Mapping) for t in value):
        return list(value)
    return None


def _answer_turns(chosen: Any, style: str) -> list:
    """The chosen answer as turns: one turn (LLaMA-Factory's pairwise form) as itself, else :func:`_as_turns`
    (a string being an assistant turn)."""
    turns = [chosen] if isinstance(chosen, Mapping) else _as_turns(chosen, style, "assistant")
    if turns is None:
        raise _unread_pair(f"chosen is {_short(chosen)}: not a string, a turn or a list of turns")
    return turns


#: the fields of a TRL prompt/completion record (standard or conversational: :func:`prompt_completion_turns`)
PROMPT_COMPLETION_FIELDS = ("prompt", "completion")


def prompt_completion_turns(record: Mapping) -> list:
    """A TRL prompt/completion record (its KTO form too: ``label`` beside them) -> turns: the prompt (a string as
    one user turn, or its turns) then the completion (a string as one assistant turn, or its turns)."""
    prompt = _as_turns(record["prompt"], "role", "user")
    completion = _as_turns(record["completion"], "role", "assistant")
    for field, turns in (("prompt", prompt), ("completion", completion)):
        if turns is None:
            raise SampleSkipped(
                "bad_conversation",
                f"{field} is {_short(record[field])}: a TRL prompt/completion record holds a string or a list of "
                "turns in each",
            )
    return [*prompt, *completion]


def _unread_pair(found: str) -> SampleSkipped:
    return SampleSkipped("preference_data", f"chosen/rejected of a shape not read as SFT: {found}")


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[tuple[str, str], ...]  # ("text", s) | ("image", "") | ("video", "")
    #: an assistant turn's tool calls as (function name, arguments JSON text), in order
    tool_calls: tuple[tuple[str, str], ...] = ()
    #: the record's own choice for this turn (LLaMA-Factory v1 ``loss_weight``): True trained, False not, None: the
    #: loss policy decides
    trained: bool | None = None

    @property
    def is_empty(self) -> bool:
        """No content (None, "", [] or only empty text parts) and no tool calls."""
        return not self.tool_calls and all(kind == "text" and not payload for kind, payload in self.parts)


class Conversation(list):
    """A list of :class:`Message` plus the conversation's ``tools`` (each tool as its JSON text,
    ``json.dumps(tool, ensure_ascii=False)`` as the templates' ``tojson`` writes it)."""

    def __init__(self, messages: Any = (), tools: tuple[str, ...] = ()) -> None:
        super().__init__(messages)
        self.tools = tuple(tools)

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or any(m.tool_calls or m.role == "tool" for m in self)


def conversation_tools(messages: Any) -> tuple[str, ...]:
    return tuple(getattr(messages, "tools", ()))


def _tojson(value: Any) -> str:
    """transformers' ``tojson`` filter: ``json.dumps(x, ensure_ascii=False)``."""
    return json.dumps(value, ensure_ascii=False)


def _tools(value: Any) -> tuple[str, ...]:
    """``tools`` (a list, or its JSON text as LLaMA-Factory stores it) -> one JSON text per tool."""
    if isinstance(value, str):
        value = _json_value(value, "tools") if value.strip() else None
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise SampleSkipped("bad_conversation", f"tools is {type(value).__name__}, not a list")
    if not all(isinstance(t, Mapping) for t in value):
        raise SampleSkipped("bad_conversation", "tools holds a non-object entry")
    try:
        return tuple(_tojson(t if "type" in t else {"type": "function", "function": t}) for t in value)
    except (TypeError, ValueError) as exc:
        raise SampleSkipped("bad_conversation", f"tools is not JSON-serialisable: {exc}") from None


def _json_value(text: str, what: str) -> Any:
    """A JSON text inside a record (``tools``, a ``function_call`` turn) -> its value."""
    try:
        return loads_checked(text)
    except SampleSkipped as exc:
        raise SampleSkipped("bad_conversation", f"{what} is not JSON: {exc.detail}") from None


def _function_calls(content: Any, i: int) -> list:
    """A ``function_call`` turn's content (JSON text of a call or a list of calls) -> the calls."""
    value = _json_value(content, f"turn {i} (function_call)") if isinstance(content, str) else content
    return [value] if isinstance(value, Mapping) else value


def _tool_calls(value: Any, role: str, i: int) -> tuple[tuple[str, str], ...]:
    """OpenAI ``tool_calls`` -> (name, arguments text); string arguments verbatim, others as JSON
    (the Qwen3 templates' rule)."""
    if value is None or (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 0):
        return ()
    if role != "assistant":
        raise SampleSkipped("bad_conversation", f"turn {i} ({role}) has tool_calls; only assistant turns call tools")
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise SampleSkipped("bad_conversation", f"turn {i} tool_calls is {type(value).__name__}, not a list")
    calls = []
    for k, call in enumerate(value):
        if not isinstance(call, Mapping):
            raise SampleSkipped("bad_conversation", f"turn {i} tool call {k} is {type(call).__name__}, not an object")
        fn = call.get("function") or call
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise SampleSkipped("bad_conversation", f"turn {i} tool call {k} has no function name")
        if "arguments" not in fn:
            raise SampleSkipped("bad_conversation", f"turn {i} tool call {k} ({fn['name']}) has no arguments")
        args = fn["arguments"]
        try:
            text = args if isinstance(args, str) else _tojson(args)
        except (TypeError, ValueError) as exc:
            raise SampleSkipped("bad_conversation", f"turn {i} tool call {k} arguments: {exc}") from None
        calls.append((fn["name"], text))
    return tuple(calls)


def normalize_conversation(conversation: Any, *, preference: str = "refuse") -> Conversation:
    """Any accepted conversation shape -> messages whose content is split into text / image / video
    parts (a :class:`Conversation`: a list with the record's ``tools``). ``preference="chosen"`` reads a
    preference record as the SFT record of its chosen answer (:func:`chosen_as_sft`); the default refuses it
    (a ``preference_data`` skip)."""
    chosen = check_preference(preference) == "chosen"
    conv = conversation
    tools: tuple[str, ...] = ()
    system: Any = None
    # iterative, bounded unwrapping: a JSON string, a dict around the turns, a JSON string in it
    for _ in range(3):
        if isinstance(conv, (bytes, bytearray)):
            try:
                conv = bytes(conv).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SampleSkipped("invalid_utf8", f"conversation: {exc}") from None
        if isinstance(conv, str):
            try:
                conv = loads_checked(conv)
            except SampleSkipped as exc:
                if exc.reason == "invalid_json" and exc.detail.startswith("nested too deeply"):
                    raise
                raise SampleSkipped("bad_conversation", f"conversation is not JSON: {exc.detail}") from None
        else:
            check_depth(conv)  # a deep object from a non-JSON source breaks repr/pickle later
        if not isinstance(conv, Mapping):
            break
        if chosen:
            conv = chosen_as_sft(conv)
        skip = not_sft_reason(conv)
        if skip is not None:
            raise skip
        tools = _tools(conv.get("tools")) or tools
        key = next((k for k in _TURN_KEYS if k in conv), None)
        if key is None and "instruction" in conv:
            conv = alpaca_turns(conv)
            break
        if key is None and all(k in conv for k in PROMPT_COMPLETION_FIELDS):
            if not any(isinstance(conv[k], list) for k in PROMPT_COMPLETION_FIELDS):
                raise SampleSkipped(
                    "bad_conversation",
                    'prompt/completion strings, not chat turns: read them with format="prompt_completion" '
                    "(--format prompt_completion), or write TRL's conversational form (lists of turns)",
                )
            conv = prompt_completion_turns(conv)  # TRL conversational (KTO's form too)
            break
        if key is None:
            raise SampleSkipped(
                "bad_conversation",
                "dict without messages/conversations/conversation (nor an alpaca instruction/output, nor TRL's "
                "conversational prompt/completion)",
            )
        system = conv.get("system", system)
        conv = conv[key]
        if not isinstance(conv, (str, bytes, bytearray)):
            break
    if not isinstance(conv, Sequence) or isinstance(conv, (str, bytes)):
        raise SampleSkipped("bad_conversation", f"expected a list of turns, got {type(conv).__name__}")
    if len(conv) == 0:
        raise SampleSkipped("empty_conversation", "conversation has no turns")
    messages = []
    for i, turn in enumerate(conv):
        if not isinstance(turn, Mapping):
            raise SampleSkipped("bad_conversation", f"turn {i} is {type(turn).__name__}, not a dict")
        calls = turn.get("tool_calls")
        if "role" in turn:
            source, content = turn["role"], turn.get("content")
        elif "from" in turn:
            source, content = turn["from"], turn.get("value")
        else:
            raise SampleSkipped("bad_conversation", f"turn {i} has neither role nor from")
        if not isinstance(source, str) or not source:
            raise SampleSkipped("bad_conversation", f"turn {i} has an invalid role {_short(source)}")
        role = ROLE_ALIASES.get(source.lower(), source)
        if role not in ROLES:
            raise SampleSkipped(
                "unknown_role", f"turn {i} has role {_short(source)}; known: {', '.join(sorted(ROLE_ALIASES))}"
            )
        if source.lower() in CALL_ROLES:
            calls, content = _function_calls(content, i), None
        parts, part_calls = _parts(content, i)
        if part_calls:  # LLaMA-Factory v1: {"type": "tool_call", "value": "{name, arguments}"} parts
            calls = [*(calls or []), *part_calls]
        messages.append(Message(role, parts, _tool_calls(calls, role, i), _loss_weight(turn, i)))
    if system not in (None, "") and (not messages or messages[0].role != "system"):
        if not isinstance(system, str):
            raise SampleSkipped("bad_conversation", f"system is {type(system).__name__}, not a string")
        messages.insert(0, Message("system", tuple(_split_text(system))))
    return Conversation(messages, tools)


def alpaca_text(record: Mapping, key: str) -> str:
    """An alpaca record's ``key`` as text ("" when absent or null; a non-string is a ``bad_conversation`` skip)."""
    value = record.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SampleSkipped("bad_conversation", f"alpaca {key} is {type(value).__name__}, not a string")
    return value


def alpaca_prompt(record: Mapping) -> str:
    """An alpaca record's last user turn, LLaMA-Factory's rule: ``instruction`` and ``input`` joined by ``"\n"``
    (empty ones left out). The one rule of the chat path (:func:`alpaca_turns`) and prompt/completion."""
    return "\n".join(t for t in (alpaca_text(record, "instruction"), alpaca_text(record, "input")) if t)


def alpaca_turns(record: Mapping) -> list[dict]:
    """A LLaMA-Factory alpaca record -> role/content turns, as its ``AlpacaDatasetConverter`` builds
    them: ``system``, then each ``history`` ``[user, assistant]`` pair, then the user turn of
    :func:`alpaca_prompt` and the ``output`` turn."""

    system = alpaca_text(record, "system")
    turns = [{"role": "system", "content": system}] if system else []
    history = record.get("history") or []
    if not isinstance(history, list):
        raise SampleSkipped("bad_conversation", f"alpaca history is {type(history).__name__}, not a list of pairs")
    for k, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise SampleSkipped(
                "bad_conversation", f"alpaca history item {k} is not a [user, assistant] pair of strings"
            )
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    turns.append({"role": "user", "content": alpaca_prompt(record)})
    if record.get("output") is not None:
        turns.append({"role": "assistant", "content": alpaca_text(record, "output")})
    return turns


def _split_text(text: str) -> list[tuple[str, str]]:
    if _AUDIO_PLACEHOLDER in text:
        raise SampleSkipped("unsupported_audio", "an <audio> placeholder: audio is not trained here")
    parts: list[tuple[str, str]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            parts.append(("text", text[pos : m.start()]))
        parts.append(("image" if m.group() == "<image>" else "video", ""))
        pos = m.end()
    if pos < len(text):
        parts.append(("text", text[pos:]))
    return parts


def _loss_weight(turn: Mapping, i: int) -> bool | None:
    """LLaMA-Factory v1's per-message ``loss_weight`` as trained / not trained (None when absent); a weight other
    than 0 or 1 cannot be honoured by a 0/1 loss mask, so it is a counted skip, never silently rounded."""
    if "loss_weight" not in turn or turn["loss_weight"] is None:
        return None
    weight = turn["loss_weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight not in (0, 1):
        raise SampleSkipped(
            "unsupported_loss_weight", f"turn {i} loss_weight is {_short(weight)}; only 0 and 1 are honoured"
        )
    return bool(weight)


def _text_of(part: Mapping, i: int) -> str:
    """A typed text part's text: ``text`` (OpenAI/HF) or ``value`` (LLaMA-Factory v1)."""
    text = part.get("text", part.get("value", ""))
    if not isinstance(text, (str, int, float)) or isinstance(text, bool):
        raise SampleSkipped("bad_conversation", f"turn {i} has a text part of type {type(text).__name__}")
    return str(text)


def _parts(content: Any, i: int) -> tuple[tuple[tuple[str, str], ...], list]:
    """A turn's content -> its text/image/video parts and the tool calls of LLaMA-Factory v1 ``tool_call`` parts."""
    if content is None:
        return (), []
    if isinstance(content, str):
        return tuple(_split_text(content)), []
    if isinstance(content, Sequence):
        parts: list[tuple[str, str]] = []
        calls: list = []
        for part in content:
            if isinstance(part, str):
                parts.extend(_split_text(part))
                continue
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in AUDIO_PART_TYPES:
                raise SampleSkipped("unsupported_audio", f"turn {i} has an {kind} part: audio is not trained here")
            if kind == "reasoning":
                raise SampleSkipped(
                    "unsupported_reasoning",
                    f"turn {i} has a reasoning part (LLaMA-Factory v1); the rendered templates have no thinking block",
                )
            if kind == "tool_call":
                calls.extend(_function_calls(part.get("value", part.get("text")), i))
                continue
            kind = _part_kind(part)
            if kind is None:
                raise SampleSkipped("bad_conversation", f"turn {i} has an unsupported content part {_short(part)}")
            # a typed text part is literal text, as in the official templates: "<image>" stays text
            parts.append(("text", _text_of(part, i)) if kind == "text" else (kind, ""))
        return tuple(parts), calls
    raise SampleSkipped("bad_conversation", f"turn {i} content is {type(content).__name__}")


def _short(value: Any) -> str:
    """A bounded repr (depth and length capped): safe on hostile, deeply nested values."""
    return reprlib.repr(value)


_PART_TYPES = {"text": "text", "image": "image", "image_url": "image", "video": "video", "video_url": "video"}


def _part_kind(part: Any) -> str | None:
    """ "text" | "image" | "video" for an OpenAI/HF content part: by its ``type``, or, like the
    official Qwen-VL templates, by its key when it has no ``type``; None when unsupported."""
    if not isinstance(part, Mapping):
        return None
    if "type" in part:
        kind = part["type"]
        return _PART_TYPES.get(kind) if isinstance(kind, str) else None
    return next((_PART_TYPES[key] for key in ("image", "image_url", "video", "video_url", "text") if key in part), None)


def require_assistant_turn(messages: list[Message]) -> None:
    """SampleSkipped("no_assistant_turn") for a conversation with nothing to learn from;
    SampleSkipped("empty_assistant_turn") when an assistant turn has no content and no tool calls
    (training it would teach the model to answer with ``<|im_end|>`` alone)."""
    if not any(m.role == "assistant" for m in messages):
        raise SampleSkipped("no_assistant_turn", "conversation has no assistant turn")
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.is_empty:
            raise SampleSkipped("empty_assistant_turn", f"assistant turn {i} has no content and no tool calls")


def place_media(messages: list[Message], num_images: int, num_videos: int) -> list[Message]:
    """Check placeholder counts against the media; with no placeholders of a kind, put that kind's
    media first in the first user turn (images, then videos)."""
    counts = {"image": 0, "video": 0}
    for msg in messages:
        for kind, _ in msg.parts:
            if kind in counts:
                counts[kind] += 1
    prepend: list[tuple[str, str]] = []
    for kind, have in (("image", num_images), ("video", num_videos)):
        if counts[kind] == 0 and have > 0:
            prepend.extend([(kind, "")] * have)
        elif counts[kind] != have:
            raise SampleSkipped("media_count_mismatch", f"{counts[kind]} <{kind}> placeholder(s) but {have} {kind}(s)")
    if not prepend:
        return messages
    target = next((i for i, m in enumerate(messages) if m.role == "user"), 0)
    out = Conversation(messages, conversation_tools(messages))
    out[target] = dataclasses.replace(out[target], parts=tuple(prepend) + out[target].parts)
    return out


def check_conversation(conversation: Any, num_images: int = 0, num_videos: int = 0) -> Conversation:
    """The structural rules every encoder applies before rendering, in their order (normalize, an
    assistant turn, placeholders against the media); the placed messages. ``convert`` runs it on
    what it writes, so a record it writes is one the loader takes."""
    messages = conversation if isinstance(conversation, Conversation) else normalize_conversation(conversation)
    require_assistant_turn(messages)
    return place_media(messages, num_images, num_videos)
