"""Exact tensors for hand-made prompt/completion and chat samples packed into one THD row."""

import numpy as np
import pytest
import torch

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft.collate import InBatchPacker
from energon_pack.sft.dataset import PADDING_KEY
from energon_pack.sft.formats import ChatFormat, Encoded, PromptCompletionFormat
from energon_pack.thd import ThdLayout

TOK = load_demo_tokenizer()
EOS = PAD = 765  # <|endoftext|> in the demo tokenizer
IM_START, IM_END, NL = 766, 767, 198
X = -100


def test_prompt_completion_ids_and_target_mask():
    enc = PromptCompletionFormat(TOK).encode({"prompt": "Hi there", "completion": "Hello!"})
    assert enc.input_ids.tolist() == [39, 72, 394, 627, 389, 0, EOS]
    assert enc.target_mask.tolist() == [False] * 3 + [True] * 4


def test_prompt_completion_custom_fields_template_separator_and_full_loss():
    fmt = PromptCompletionFormat(
        TOK,
        prompt_field="input",
        completion_field="output",
        template="Q: {input}\nA:",
        separator=" ",
        loss="full",
        add_eos=False,
    )
    enc = fmt.encode({"input": "  Hi ", "output": "Hello!"})
    assert enc.input_ids.tolist() == [48, 25, 220, 39, 72, 198, 32, 25] + [220, 627, 389, 0]
    assert enc.target_mask.all()


def test_prompt_completion_bad_records_and_config():
    fmt = PromptCompletionFormat(TOK)
    for record, reason in [
        ({"prompt": "x"}, "missing_field"),
        ({"prompt": "x", "completion": 3}, "missing_field"),
        ({"prompt": "x", "completion": " \n"}, "empty_completion"),
        ([1, 2], "missing_field"),
    ]:
        with pytest.raises(SampleSkipped) as info:
            fmt.encode(record)
        assert info.value.reason == reason
    with pytest.raises(ConfigError, match="template"):
        PromptCompletionFormat(TOK, template="{question}")
    with pytest.raises(ConfigError, match="loss"):
        PromptCompletionFormat(TOK, loss="assistant")


CHAT_IDS = [IM_START, 574, NL, 17, 10, 17, 30, IM_END, NL, IM_START, 391, 287, 403, NL, 19, IM_END, NL]


def test_chat_messages_and_sharegpt_render_the_same_chatml():
    messages = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    sharegpt = {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}
    for record in (messages, sharegpt):
        enc = ChatFormat(TOK).encode(record)
        assert enc.input_ids.tolist() == CHAT_IDS
        # supervised: the assistant content "4" and its <|im_end|>, nothing else
        assert np.flatnonzero(enc.target_mask).tolist() == [14, 15]
    assert TOK.decode(CHAT_IDS) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"


def test_chat_loss_policies_and_no_assistant_turn():
    two_turns = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "4"},
        ]
    }
    assert ChatFormat(TOK).encode(two_turns).target_mask.sum() == 4
    last = ChatFormat(TOK, loss_policy="last_turn").encode(two_turns)
    assert np.flatnonzero(last.target_mask).tolist() == [len(last.input_ids) - 3, len(last.input_ids) - 2]
    with pytest.raises(SampleSkipped) as info:
        ChatFormat(TOK).encode({"messages": [{"role": "user", "content": "Hi"}]})
    assert info.value.reason == "no_assistant_turn"


def _packer(seq_length, **kw):
    return InBatchPacker(ThdLayout(seq_length=seq_length, pad_token_id=PAD, **kw))


def test_packed_row_exact_tensors_prompt_completion_and_chat():
    pc = PromptCompletionFormat(TOK).encode({"prompt": "Hi there", "completion": "Hello!"})  # 7 tokens
    chat = ChatFormat(TOK).encode(
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    )
    batch = _packer(32, pad_multiple=4)(
        [Encoded(pc.input_ids, pc.target_mask, 1), Encoded(chat.input_ids, chat.target_mask, 2)]
    )
    assert batch["input_ids"].tolist() == [[39, 72, 394, 627, 389, 0, EOS, PAD] + CHAT_IDS + [PAD] * 3]
    #  segment 1: positions 2..5 predict "Hello!" + EOS; last real token and the gap predict nothing
    assert batch["labels"].tolist() == [[X, X, 627, 389, 0, EOS, X, X] + [X] * 13 + [19, IM_END, X, X, X, X, X]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 0, 0] + [0] * 13 + [1, 1, 0, 0, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [list(range(8)) + list(range(20))]
    assert batch["cu_seqlens_q"].tolist() == [0, 7, 24]
    assert batch["cu_seqlens_q_padded"].tolist() == [0, 8, 28]
    assert batch["padding_mask"].tolist() == [[False] * 7 + [True] + [False] * 17 + [True] * 3]
    assert int(batch["max_seqlen_q"]) == 20
    assert (batch["real_tokens"], batch["supervised_tokens"], batch["total_tokens"]) == (24, 6, 28)
    assert batch["__keys__"] == [1, 2] and batch["padding_segments"] == 0
    assert batch["cu_seqlens_q"].dtype == torch.int32 and batch["loss_mask"].dtype == torch.float32


def test_padding_samples_never_carry_loss_fixed_width_static_cu():
    pc = PromptCompletionFormat(TOK).encode({"prompt": "Hi there", "completion": "Hello!"})
    fake_pad = Encoded(np.array([PAD, PAD, PAD]), np.ones(3, dtype=bool), PADDING_KEY)  # even if it claims targets
    batch = _packer(16, pad_to_max_length=True, pad_cu_seqlens=True, max_segments=4)(
        [Encoded(pc.input_ids, pc.target_mask, 1), fake_pad]
    )
    assert batch["loss_mask"][0, 7:].sum() == 0 and (batch["labels"][0, 7:] == X).all()
    assert batch["loss_mask"].sum() == 4
    assert batch["cu_seqlens_q"].tolist() == [0, 7, 10, 10, 10]
    assert batch["cu_seqlens_q_padded"].tolist() == [0, 7, 16, 16, 16]
    assert int(batch["max_seqlen_q"]) == 16 and batch["input_ids"].shape == (1, 16)
    assert batch["padding_segments"] == 1 and batch["real_tokens"] == 7
    only_pad = _packer(8)([fake_pad])
    assert only_pad["loss_mask"].sum() == 0 and only_pad["supervised_tokens"] == 0


def test_packer_rejects_overflowing_micro_batch_and_bad_layout():
    pc = PromptCompletionFormat(TOK).encode({"prompt": "Hi there", "completion": "Hello!"})
    with pytest.raises(ValueError, match="TokenBudgetBatchSampler"):
        _packer(12)([pc, pc])
    with pytest.raises(ConfigError, match="layout"):
        InBatchPacker(4096)


def test_prompt_completion_with_a_non_qwen_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, "hi": 2, "there": 3, "yes": 4}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    enc = PromptCompletionFormat(raw, eos_id=1).encode({"prompt": "hi there", "completion": "yes"})
    assert enc.input_ids.tolist() == [2, 3, 4, 1] and enc.target_mask.tolist() == [False, False, True, True]
    with pytest.raises(ConfigError, match="add_eos"):
        PromptCompletionFormat(raw)
