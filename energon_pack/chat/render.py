"""ChatML rendering into token ids with a per-token "supervised" mask, by loss policy.

Token layout per turn: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. Text between two special
tokens is tokenised as one string, so the ids equal those of tokenising the whole rendered
string at once (tested). Text never produces control tokens: a run that tokenizes to one of the
tokenizer's special tokens (a typed ``<|image_pad|>`` or ``<|im_end|>``) is a counted
``control_token_in_text`` skip, and text that is not valid Unicode (a lone surrogate) an
``invalid_text`` skip; control tokens are only written by :meth:`ChatMLBuilder.special`. Media parts are
rendered by a callback the model family supplies
(:mod:`energon_pack.qwen_vl` writes its vision blocks); the text-only path has none.

Tool calling (``render_chat(..., tools=True)``) is rendered exactly as the official Qwen3-VL
Instruct template does (the Qwen2.5 / Qwen3 LLM templates use the same blocks): a ``tools`` list
becomes a system turn (the conversation's own system text + ``\n\n``, then the ``# Tools``
preamble with one ``tojson`` line per tool); an assistant turn's tool calls follow its content as
``<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`` blocks (string arguments verbatim);
consecutive ``tool`` turns are merged into one ``user`` turn of ``<tool_response>\n...\n</tool_response>``
blocks. Tool calls are supervised like the rest of their assistant turn; tool responses like
user text (not under the default ``assistant`` policy). With ``tools=False`` (the Qwen2-VL /
Qwen2.5-VL Instruct templates have no tool handling) a conversation with tools, tool calls or
tool turns is a counted ``tool_calls_unsupported`` skip instead of being mangled.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ConfigError, SampleSkipped
from .conversation import (
    Message,
    check_preference,
    conversation_tools,
    normalize_conversation,
    place_media,
    require_assistant_turn,
)
from .templates import TEMPLATE_DEFAULT
from .token_bound import cached_max_bytes_per_token
from .tokenizer import QwenTokenizer, as_qwen_tokenizer

LOSS_POLICIES = ("assistant", "last_turn", "all")

#: The official Qwen3-VL (and Qwen2.5 / Qwen3 LLM) template's tool preamble, around one JSON line per tool.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(frozen=True)
class ChatConfig:
    """Rendering and sample limits (Bridge defaults for the limits); validated at construction.

    Args:
        system_prompt: inserted when the conversation has no system turn. The default,
            ``TEMPLATE_DEFAULT``, is the official template's own (Qwen2/2.5-VL: "You are a helpful
            assistant."; Qwen3-VL and text chat: none); ``None`` inserts none; a string inserts it.
        loss_policy: which tokens are supervised: ``"assistant"`` (every assistant turn, default),
            ``"last_turn"`` (the last assistant turn only) or ``"all"`` (every token).
        max_num_images: images per sample (default 10, Bridge's); more is a counted
            ``SampleSkipped("too_many_images")``.
        max_num_frames: frames per video (default 60, Bridge's); longer videos keep their first frames.
        max_visual_tokens: visual tokens per sample (default 16384); more is a counted
            ``SampleSkipped("too_many_visual_tokens")``.
        train_newline_after_im_end: also supervise the "\\n" after each supervised ``<|im_end|>``
            (Megatron-Bridge's loss rule, docs/guides/energon_vlm.md, "Loss rule"); default False (ours).
        preference: what a preference record (DPO/ORPO/reward ``chosen``/``rejected``, LLaMA-Factory ranking)
            becomes: ``"refuse"`` (default) a counted ``preference_data`` skip, ``"chosen"`` the SFT record of its
            prompt and chosen answer (:func:`~energon_pack.chat.conversation.chosen_as_sft`).
    """

    system_prompt: str | None = TEMPLATE_DEFAULT  # type: ignore[assignment]
    loss_policy: str = "assistant"  # "assistant" | "last_turn" | "all"
    max_num_images: int = 10  # more -> SampleSkipped("too_many_images")
    max_num_frames: int = 60  # longer videos are truncated to their first frames (Bridge)
    max_visual_tokens: int = 16384  # more -> SampleSkipped("too_many_visual_tokens")
    # Megatron-Bridge's rule: also train the "\n" after each supervised <|im_end|> (docs/guides/energon_vlm.md)
    train_newline_after_im_end: bool = False
    preference: str = "refuse"  # "refuse" | "chosen" (PREFERENCE_MODES)

    def __post_init__(self) -> None:
        check_preference(self.preference)
        if self.loss_policy not in LOSS_POLICIES:
            raise ConfigError("loss_policy", f"unknown policy {self.loss_policy!r}", f"use one of {LOSS_POLICIES}")
        if not isinstance(self.train_newline_after_im_end, bool):
            raise ConfigError(
                "train_newline_after_im_end",
                f"must be a bool, got {self.train_newline_after_im_end!r}",
                "True for Megatron-Bridge's loss rule, False (default) for ours",
            )
        for knob in ("max_num_images", "max_num_frames", "max_visual_tokens"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if knob == "max_num_images" else 1):
                raise ConfigError(
                    knob, f"must be a positive int, got {value!r}", f"set {knob} to e.g. {getattr(ChatConfig, knob)}"
                )
        if (
            self.system_prompt is not TEMPLATE_DEFAULT
            and self.system_prompt is not None
            and not isinstance(self.system_prompt, str)
        ):
            raise ConfigError(
                "system_prompt",
                "must be a string, None (no system turn) or TEMPLATE_DEFAULT",
                "pass a str, or None for no system prompt",
            )

    def resolve_system_prompt(self, template_default: str | None) -> str | None:
        """The system prompt to insert, given the model family's template default."""
        return template_default if self.system_prompt is TEMPLATE_DEFAULT else self.system_prompt


class ChatMLBuilder:
    """Collects the token stream: text runs are flushed (tokenised once) at each special token.

    ``max_length``: SampleSkipped("too_long") as soon as the tokens so far plus the text held hold
    more than that many tokens by the text's bytes alone (:mod:`.token_bound`), before tokenising it.
    """

    def __init__(self, tok: QwenTokenizer, materialize: bool, max_length: int | None = None) -> None:
        self.tok = tok
        self.materialize = materialize
        self.max_length = max_length
        self.ids: list[int] = []
        self.mask: list[bool] = []
        self.length = 0
        self._run: list[tuple[str, bool]] = []
        self._run_bytes = 0

    def text(self, s: str, trained: bool) -> None:
        if s:
            self._run.append((s, trained))
            if self.max_length is not None:
                self._bound(s)

    def _bound(self, s: str) -> None:
        """SampleSkipped("too_long") when the text held proves the sample longer than ``max_length``."""
        per_token = cached_max_bytes_per_token(self.tok)
        if per_token is None:
            return
        self._run_bytes += len(s.encode("utf-8", "surrogatepass"))
        at_least = self.length + -(-self._run_bytes // per_token)
        if at_least > self.max_length:
            raise SampleSkipped(
                "too_long",
                f"at least {at_least} tokens ({self._run_bytes} bytes of text held, <= {per_token} bytes a token) "
                f"> max_length {self.max_length}",
            )

    def flush(self) -> None:
        """Tokenise the pending text once, as one string (BPE merges across part boundaries stay
        exact); supervision flags follow the spans. Only a change of flag needs a boundary: the
        tokens both the text so far and the whole run share go to the spans before it, so adjacent
        spans of one flag (a turn of many typed text parts) merge first and the cost stays linear."""
        if not self._run:
            return
        runs: list[list] = []  # [characters, flag] of adjacent spans of one flag
        for s, trained in self._run:
            if runs and runs[-1][1] == trained:
                runs[-1][0] += len(s)
            else:
                runs.append([len(s), trained])
        full = "".join(s for s, _ in self._run)
        ids = self.tok.encode_text(full)  # text never produces control tokens (counted skip)
        flags = [False] * len(ids)
        pieces = self._pieces(full, ids) if len(runs) > 3 else None
        start_tok, char = 0, 0
        for j, (chars, trained) in enumerate(runs):
            char += chars
            if j == len(runs) - 1:
                end_tok = len(ids)
            else:
                end_tok = max(self._shared_tokens(full, ids, char, pieces), start_tok)
            if trained:
                flags[start_tok:end_tok] = [True] * (end_tok - start_tok)
            start_tok = end_tok
        self.length += len(ids)
        if self.materialize:
            self.ids.extend(ids)
            self.mask.extend(flags)
        self._run = []
        self._run_bytes = 0

    def _pieces(self, full: str, ids: list[int]) -> list[tuple[int, int, int]] | None:
        """``full`` cut at the tokenizer's added tokens, as (first char, end char, first token) of each piece,
        when the pieces' own ids joined are ``ids`` (checked: HF tokenizers split added tokens out first); None
        otherwise. A flag change then costs its own piece's length, not the whole run's: a conversation of
        many tool turns (one ``<tool_response>`` block each, flags alternating) stays linear."""
        pattern = self.tok.added_token_pattern
        if pattern is None:
            return None
        pieces, joined, at = [], [], 0
        for m in [*pattern.finditer(full), None]:
            for a, b in ((at, m.start()), (m.start(), m.end())) if m is not None else ((at, len(full)),):
                if a < b:
                    pieces.append((a, b, len(joined)))
                    joined.extend(self.tok.encode(full[a:b]))
            at = m.end() if m is not None else at
        return pieces if joined == ids else None

    def _shared_tokens(self, full: str, ids: list[int], char: int, pieces: list[tuple[int, int, int]] | None) -> int:
        """How many leading tokens ``full[:char]`` and the whole run ``full`` (``ids``) share: the tokens that
        belong to the spans before ``char``. With ``pieces``, only the piece holding ``char`` is tokenised again."""
        start, first = 0, 0
        if pieces:
            a, b, tok = pieces[bisect.bisect_right(pieces, (char, len(full) + 1)) - 1]  # the piece holding char
            start, first = (a, tok) if a <= char < b else (0, 0)
        if char == start:
            return first
        prefix = self.tok.encode(full[start:char])
        shared, limit = 0, min(len(prefix), len(ids) - first)
        while shared < limit and prefix[shared] == ids[first + shared]:
            shared += 1
        return first + shared

    def special(self, tid: int, trained: bool, count: int = 1) -> None:
        self.flush()
        self.length += count
        if self.materialize:
            self.ids.extend([tid] * count)
            self.mask.extend([trained] * count)

    def supervised(self, loss_policy: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids int64, unshifted target mask bool); control tokens are never targets.

        SampleSkipped("no_trained_tokens") when nothing after the first token is supervised.
        """
        input_ids = torch.tensor(self.ids, dtype=torch.int64)
        skipped = torch.tensor(sorted(self.tok.special.skipped), dtype=torch.int64)
        target = torch.tensor(self.mask, dtype=torch.bool) & ~torch.isin(input_ids, skipped)
        if not bool(target[1:].any()):
            raise SampleSkipped("no_trained_tokens", f"loss policy {loss_policy!r} leaves no supervised token")
        return input_ids, target


MediaBlock = Callable[[ChatMLBuilder, str], None]


def _turn_trained(messages: list[Message], policy: str) -> list[bool]:
    """Which turns are supervised: the loss policy's choice, except where a turn carries its own
    (:attr:`Message.trained`, LLaMA-Factory v1's ``loss_weight``)."""
    if policy == "all":
        flags = [True] * len(messages)
    elif policy == "last_turn":
        last = max(i for i, m in enumerate(messages) if m.role == "assistant")
        flags = [i == last for i in range(len(messages))]
    else:
        flags = [m.role == "assistant" for m in messages]
    return [flag if getattr(m, "trained", None) is None else m.trained for flag, m in zip(flags, messages)]


def render_chat(
    messages: list[Message],
    tok: QwenTokenizer,
    *,
    loss_policy: str,
    system_prompt: str | None,
    media_block: MediaBlock | None = None,
    materialize: bool = True,
    tools: bool = False,
    template: str = "this chat template",
    train_newline_after_im_end: bool = False,
    max_length: int | None = None,
) -> ChatMLBuilder:
    """Render ``messages`` (media already placed) as ChatML; ``media_block(builder, kind)`` writes
    each image / video part. ``system_prompt`` is inserted when the first turn is not a system turn.
    ``train_newline_after_im_end``: the ``\n`` after a supervised ``<|im_end|>`` is supervised too
    (Megatron-Bridge's rule); by default it never is.
    ``tools``: render tools / tool calls / tool turns the Qwen3 way (see the module docstring);
    False: SampleSkipped("tool_calls_unsupported") when the conversation has any (``template`` names
    the template in the detail). ``max_length``: stop early with SampleSkipped("too_long") (:class:`ChatMLBuilder`)."""
    tool_list = conversation_tools(messages)
    uses_tools = bool(tool_list) or any(m.tool_calls or m.role == "tool" for m in messages)
    if uses_tools and not tools:
        raise SampleSkipped(
            "tool_calls_unsupported",
            f"the conversation has tools, tool calls or tool turns and {template} has no tool handling",
        )
    if system_prompt is not None and messages[0].role != "system":
        messages = [Message("system", (("text", system_prompt),))] + list(messages)
    sp = tok.special
    b = ChatMLBuilder(tok, materialize, max_length)
    trained_flags = _turn_trained(messages, loss_policy)

    def end_turn(trained: bool) -> None:
        b.special(sp.im_end, trained)
        b.text("\n", trained and train_newline_after_im_end)

    def parts(msg: Message, trained: bool) -> None:
        for kind, payload in msg.parts:
            if kind == "text":
                b.text(payload, trained)
            elif media_block is None:
                raise SampleSkipped("media_count_mismatch", f"a <{kind}> part in a text-only conversation")
            else:
                media_block(b, kind)

    start = 0
    if tool_list:  # the system turn carries the tool signatures
        has_system = messages[0].role == "system"
        trained = trained_flags[0] if has_system else loss_policy == "all"
        b.special(sp.im_start, False)
        b.text("system\n", False)
        if has_system:
            parts(messages[0], trained)
            b.text("\n\n", trained)
            start = 1
        b.text(TOOLS_PREAMBLE + "".join("\n" + t for t in tool_list) + TOOLS_POSTAMBLE, trained)
        end_turn(trained)
    for i in range(start, len(messages)):
        msg, trained = messages[i], trained_flags[i]
        if msg.role == "tool":  # consecutive tool turns: one user turn of <tool_response> blocks
            if i == 0 or messages[i - 1].role != "tool":
                b.special(sp.im_start, False)
                b.text("user", False)
            b.text("\n<tool_response>\n", trained)
            parts(msg, trained)
            b.text("\n</tool_response>", trained)
            if i == len(messages) - 1 or messages[i + 1].role != "tool":
                end_turn(trained)
            continue
        b.special(sp.im_start, False)
        b.text(f"{msg.role}\n", False)
        parts(msg, trained)
        for k, (name, arguments) in enumerate(msg.tool_calls):
            sep = "\n" if k > 0 or msg.parts else ""
            b.text(f'{sep}<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>', trained)
        end_turn(trained)
    b.flush()
    return b


def encode_text_chat(
    conversation,
    *,
    tokenizer,
    config: ChatConfig | None = None,
    template_default: str | None = None,
    max_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A text-only conversation -> (input_ids, unshifted target mask); media placeholders are a
    counted ``media_count_mismatch`` skip. Tool calls are rendered the Qwen3 way (module docstring).
    ``max_length``: a conversation whose text alone proves it longer is a counted ``too_long`` skip
    before it is tokenised (None: no bound; a caller that truncates passes None)."""
    config = config or ChatConfig()
    tok = as_qwen_tokenizer(tokenizer)
    messages = normalize_conversation(conversation, preference=config.preference)
    require_assistant_turn(messages)
    messages = place_media(messages, 0, 0)
    b = render_chat(
        messages,
        tok,
        loss_policy=config.loss_policy,
        system_prompt=config.resolve_system_prompt(template_default),
        tools=True,
        train_newline_after_im_end=config.train_newline_after_im_end,
        max_length=max_length,
    )
    return b.supervised(config.loss_policy)
