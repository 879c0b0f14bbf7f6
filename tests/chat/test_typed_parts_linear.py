"""A turn of many typed text parts tokenises as its joined text, once, in linear time (issue 45).

``ChatMLBuilder.flush`` used to re-tokenise the text before every part boundary to place the
supervision flags, so 8,000 ``{"type": "text"}`` parts took minutes and gigabytes; now only a
change of flag needs a boundary, and the ids and mask stay those of the joined text.
"""

import pytest

from energon_pack.chat import ChatConfig, encode_text_chat, load_tokenizer
from energon_pack.chat.tokenizer import QwenTokenizer
from energon_pack.errors import SampleSkipped

TEXT = "Grüße aus Köln: naïve café, 東京タワー 🙂👍🏽 e\u0301t\u00e9  spaces\n\tand 12345 digits, supercalifragilistic!"


@pytest.fixture(scope="module")
def raw():
    return load_tokenizer("qwen2.5-vl").inner


@pytest.fixture(scope="module")
def raw3():
    """Qwen3-VL's tokenizer: the one whose template renders tool turns, with ``<tool_response>`` an added token."""
    return load_tokenizer("qwen3-vl").inner


class CountingTokenizer:
    """A :class:`TokenizerLike` over the raw Qwen tokenizer that counts calls and characters (a fast
    tokenizer to the byte bound, as a Hugging Face one is)."""

    is_fast = True

    def __init__(self, raw):
        self.raw, self.calls, self.chars = raw, 0, 0
        self.backend_tokenizer = raw

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        self.chars += len(text)
        return self.raw.encode(text, add_special_tokens=add_special_tokens).ids

    def convert_tokens_to_ids(self, token):
        return self.raw.token_to_id(token)


def _conversation(pieces, answer="Sure, here it is."):
    content = [{"type": "text", "text": p} for p in pieces]
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


def _splits(text):
    """Cuts inside words, between a letter and its combining accent, inside emoji sequences, one per char."""
    return [
        [text],
        [text[:3], text[3:]],  # inside "Grüße"
        [text[: text.index("\u0301")], text[text.index("\u0301") :]],  # e | combining acute (NFC joins them)
        [text[: text.index("🏽")], text[text.index("🏽") :]],  # emoji | skin-tone modifier
        list(text),  # one char a part
        [text[i : i + 7] for i in range(0, len(text), 7)],
    ]


@pytest.mark.parametrize("policy", ["assistant", "all"])
def test_typed_parts_give_the_ids_and_mask_of_the_joined_text(raw, policy):
    tok = QwenTokenizer(raw)
    config = ChatConfig(loss_policy=policy)
    rendered = f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\nSure, here it is.<|im_end|>\n"
    reference = raw.encode(rendered, add_special_tokens=False).ids
    head = raw.encode(f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    answer = raw.encode("Sure, here it is.", add_special_tokens=False).ids
    user = raw.encode(TEXT, add_special_tokens=False).ids
    if policy == "assistant":  # the answer and its <|im_end|>
        expected = [False] * len(head) + [True] * (len(answer) + 1) + [False]
    else:  # every token but the role headers, <|im_start|> and the "\n" after <|im_end|>
        expected = [False, False, False, *[True] * len(user), True, False] + [False] * 3
        expected += [True] * (len(answer) + 1) + [False]
    for pieces in _splits(TEXT):
        assert "".join(pieces) == TEXT
        ids, target = encode_text_chat(_conversation(pieces), tokenizer=tok, config=config)
        assert ids.tolist() == reference, len(pieces)
        assert target.tolist() == expected, len(pieces)


def test_many_typed_parts_tokenise_once(raw):
    """2,000 parts: the tokenizer sees the turn's text once, not once per part (was 2,000 calls, ~n²/2 chars)."""
    pieces = [f"part {i} wörds, " for i in range(2000)]
    counting = CountingTokenizer(raw)
    tok = QwenTokenizer(counting, cache_size=0)
    setup_calls, setup_chars = counting.calls, counting.chars  # the special tokens, checked once
    ids, target = encode_text_chat(_conversation(pieces), tokenizer=tok)
    text = "".join(pieces)
    assert (
        ids.tolist()
        == raw.encode(
            f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\nSure, here it is.<|im_end|>\n",
            add_special_tokens=False,
        ).ids
    )
    # "user\n" + text (one flag: no boundary), "\n", "assistant\n" + answer and its boundary "assistant\n", "\n"
    assert counting.calls - setup_calls == 5
    assert counting.chars - setup_chars == len("user\n" + text) + 1 + len("assistant\nSure, here it is.") + 10 + 1
    assert int(target.sum()) == len(raw.encode("Sure, here it is.", add_special_tokens=False).ids) + 1


def test_text_longer_than_max_length_by_its_bytes_stops_before_tokenising(raw):
    """384 bytes a token at most (Qwen2.5-VL, NFC): <|im_start|>, "user\n" and 191 parts of 200 bytes prove 101."""
    counting = CountingTokenizer(raw)
    tok = QwenTokenizer(counting, cache_size=0)
    setup_calls = counting.calls
    conversation = _conversation(["abcdefghij" * 20] * 5000)
    with pytest.raises(SampleSkipped) as skip:
        encode_text_chat(conversation, tokenizer=tok, max_length=100)
    assert skip.value.reason == "too_long"
    assert skip.value.detail == (
        "at least 101 tokens (38205 bytes of text held, <= 384 bytes a token) > max_length 100"
    )
    assert counting.calls == setup_calls  # nothing of the sample was tokenised


def test_the_byte_bound_leaves_samples_within_max_length_unchanged(raw):
    tok = QwenTokenizer(raw)
    conversation = _conversation(_splits(TEXT)[-1])
    ids, target = encode_text_chat(conversation, tokenizer=tok)
    bounded = encode_text_chat(conversation, tokenizer=tok, max_length=len(ids))
    assert bounded[0].tolist() == ids.tolist() and bounded[1].tolist() == target.tolist()


def _reference_mask(raw, spans):
    """The supervision flags by the rule itself: the tokens that ``text[:c]`` and the whole text share go to the
    spans before each flag change ``c`` (each prefix tokenised in full: quadratic, fine for a reference)."""
    full = "".join(s for s, _ in spans)
    ids = raw.encode(full, add_special_tokens=False).ids
    flags, start, char = [False] * len(ids), 0, 0
    for j, (s, trained) in enumerate(spans):
        char += len(s)
        if j == len(spans) - 1:
            end = len(ids)
        else:
            prefix = raw.encode(full[:char], add_special_tokens=False).ids
            end = next((i for i, (a, b) in enumerate(zip(prefix, ids)) if a != b), min(len(prefix), len(ids)))
            end = max(end, start)
        flags[start:end] = [trained] * (end - start)
        start = end
    return ids, flags


def _tool_turns(n):
    """``n`` tool responses rendered as the template merges them, their flags alternating (LLaMA-Factory's
    per-turn loss_weight), the cut between two of them inside a word at times."""
    texts = ["42", "ok.", "naïve 東京", "a  b", "x" * 17, '{"k": [1, 2]}']
    spans = []
    for i in range(n):
        body = texts[i % len(texts)]
        spans.append((f"\n<tool_response>\n{body}\n</tool_response>", i % 2 == 0))
    return spans


@pytest.mark.parametrize("n", [4, 9, 30])
def test_alternating_tool_turns_keep_the_rules_mask(raw, raw3, n):
    """Many flag changes in one run (consecutive tool turns with their own loss flags): the builder cuts the run
    at the tokenizer's added tokens and gives the rule's exact ids and flags."""
    from energon_pack.chat.render import ChatMLBuilder

    spans = _tool_turns(n) + [("tail with no added token", True), (" and more", False)]
    for tokenizer in (raw3, raw):  # <tool_response> an added token, and plain text (no cut: the rule in full)
        builder = ChatMLBuilder(QwenTokenizer(tokenizer), materialize=True)
        for s, trained in spans:
            builder.text(s, trained)
        builder.flush()
        ids, flags = _reference_mask(tokenizer, spans)
        assert builder.ids == ids and builder.mask == flags


def test_alternating_tool_turns_tokenise_in_linear_time(raw3):
    """2,000 alternating tool turns: the tokenizer sees about three times the text, not a prefix per turn
    (the per-change prefixes were ~n²/2 characters: 2,000 turns ~ 30M)."""
    from energon_pack.chat.render import ChatMLBuilder

    spans = _tool_turns(2000)
    counting = CountingTokenizer(raw3)
    builder = ChatMLBuilder(QwenTokenizer(counting, cache_size=0), materialize=True)
    for s, trained in spans:
        builder.text(s, trained)
    builder.flush()
    full = sum(len(s) for s, _ in spans)
    assert counting.chars <= 3 * full, (counting.chars, full)
    assert builder.ids == raw3.encode("".join(s for s, _ in spans)).ids and sum(builder.mask) > 0
