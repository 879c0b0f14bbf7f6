"""Configuration mistakes raise ConfigError naming the knob and the fix; no silent default changes
results (a Qwen-VL encoder's default is its preset's real tokenizer; the demo tokenizer only by name,
else a loud warning); mostly-skipped streams warn."""

import dataclasses
import json
import logging
import warnings

import pytest
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from energon_pack.chat import DemoTokenizerWarning, describe_tokenizer, load_demo_tokenizer, load_tokenizer
from energon_pack.energon import AllSkippedError, PackingConfig, TextPackingTaskEncoder, prepare_jsonl
from energon_pack.errors import ConfigError
from energon_pack.qwen_vl.presets import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.sft import JsonlSFTDataset
from energon_pack.sft.formats import PromptCompletionFormat

transformers = pytest.importorskip("transformers")


def _jsonl(tmp_path, records, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    prepare_jsonl(path)
    return path


def _dataset(path, te, *, batch_size=1, buffer=8, workers=0):
    return get_train_dataset(
        str(path),
        batch_size=batch_size,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        task_encoder=te,
        packing_buffer_size=buffer,
        repeat=False,
    )


GOOD = {"prompt": "what is the answer", "completion": "it is yes"}


# ------------------------------------------------------------------ problem 5: the demo tokenizer
@pytest.mark.parametrize(
    "make",
    [
        lambda p: QwenVLPackingTaskEncoder(
            seq_length=1024, preset=dataclasses.replace(get_preset("qwen2.5-vl"), name="my-vl")
        ),
        lambda p: TextPackingTaskEncoder(format="chat"),
        lambda p: JsonlSFTDataset(p, None),
    ],
    ids=["QwenVLPackingTaskEncoder-custom-preset", "TextPackingTaskEncoder", "JsonlSFTDataset"],
)
def test_leaving_out_the_tokenizer_warns_naming_the_demo_tokenizer_and_the_fix(tmp_path, make):
    """Where no model is known (text paths, a preset of another name), None still warns and names the fixes."""
    path = _jsonl(tmp_path, [GOOD])
    with pytest.warns(DemoTokenizerWarning) as rec:
        make(path)
    message = str(rec[0].message)
    assert "no tokenizer given, so the offline DEMO tokenizer is used (773 tokens" in message
    assert 'tokenizer="qwen2.5-vl"' in message and "a Hugging Face tokenizer" in message
    assert 'tokenizer="demo"' in message
    assert rec[0].filename == __file__  # points at the caller's line


@pytest.mark.parametrize("preset", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_a_qwen_vl_encoder_without_tokenizer_uses_its_presets_real_tokenizer_silently(preset):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        te = QwenVLPackingTaskEncoder(seq_length=1024, preset=preset)
    assert describe_tokenizer(te.tokenizer) == describe_tokenizer(load_tokenizer(preset))
    assert te.tokenizer.special.image_pad == 151655 and te.tokenizer.pad_id == 151643
    assert te.tokenizer.encode("Hello world") == [9707, 1879]  # Qwen's ids, not the demo's


def test_demo_tokenizer_by_name_is_silent(tmp_path):
    path = _jsonl(tmp_path, [GOOD])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QwenVLPackingTaskEncoder(tokenizer="demo", seq_length=1024)
        te = TextPackingTaskEncoder(tokenizer="demo")
        ds = JsonlSFTDataset(path, "demo")
    assert (
        te.format.tokenizer.encode("hello")
        == load_demo_tokenizer().encode("hello")
        == ds.format.tokenizer.encode("hello")
    )


# ------------------------------------------------------------------ problem 7: no EOS
def _hf_without_eos():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, "what": 2, "is": 3, "the": 4, "answer": 5, "it": 6, "yes": 7}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]")


def test_prompt_completion_without_eos_raises_add_eos(tmp_path):
    hf = _hf_without_eos()
    assert hf.eos_token_id is None and hf.convert_tokens_to_ids("<|endoftext|>") == hf.unk_token_id  # the trap
    for make in (
        lambda: PromptCompletionFormat(hf),
        lambda: TextPackingTaskEncoder(tokenizer=hf),
        lambda: JsonlSFTDataset(_jsonl(tmp_path, [GOOD]), hf),
    ):
        with pytest.raises(
            ConfigError,
            match=r"add_eos: the tokenizer has no eos_token_id nor <\|endoftext\|>.*"
            r"Fix: pass eos_id=.*or add_eos=False",
        ) as exc:
            make()
        assert exc.value.knob == "add_eos"


def test_prompt_completion_with_an_explicit_eos_ends_with_it_not_unk(tmp_path):
    hf = _hf_without_eos()
    te = TextPackingTaskEncoder(tokenizer=hf, eos_id=7, seq_length=64)
    batch = next(iter(get_loader(_dataset(_jsonl(tmp_path, [GOOD] * 3), te))))
    cu = batch["cu_seqlens_q"].tolist()
    for n in range(len(cu) - 1):
        segment = batch["input_ids"][0, cu[n] : cu[n + 1]].tolist()
        assert segment[-1] == 7 and hf.unk_token_id not in segment
    assert TextPackingTaskEncoder(tokenizer=hf, add_eos=False).format.eos_id is None


# ------------------------------------------------------------------ problem 8: batch_size > 1 without packing
def test_batch_size_above_one_without_packing_raises_naming_the_fix(tmp_path):
    path = _jsonl(tmp_path, [GOOD] * 20)
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=64)
    with pytest.raises(
        ConfigError,
        match=r"batch_size: batch_size=4 without packing_buffer_size would concatenate 4 "
        r"samples into one THD row of at most seq_length=64 tokens.*"
        r"Fix: pass packing_buffer_size=K \(e.g. 64\) with batch_size=1",
    ) as exc:
        _dataset(path, te, batch_size=4, buffer=None)
    assert exc.value.knob == "batch_size"
    # batch_size=1 without packing: one sample per row, every sample kept
    batches = list(get_loader(_dataset(path, te, batch_size=1, buffer=None)))
    assert len(batches) == 20 and all(b["num_segments"] == 1 for b in batches)


# ------------------------------------------------------------------ a width below every sample
def test_width_below_the_chat_headers_raises_at_construction():
    with pytest.raises(
        ConfigError,
        match=r"seq_length: 16 is below the shortest possible sample: a one-token answer "
        r"to an empty question \(the chat template's headers\) is already 25 tokens",
    ):
        QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=16)
    with pytest.raises(ConfigError, match=r"seq_length: 8 is below .* already 13 tokens .*use seq_length >= 13"):
        TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=8)
    QwenVLPackingTaskEncoder(tokenizer="demo", preset="qwen2.5-vl", seq_length=25)  # exactly the shortest fits
    TextPackingTaskEncoder(tokenizer="demo", format="chat", seq_length=8, overlength="truncate")


def test_width_below_every_sample_fails_fast_in_the_stream(tmp_path):
    long = {"prompt": "tell a long story " * 10, "completion": " long" * 50}
    path = _jsonl(tmp_path, [long] * 80)
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=32, skip_guard=40)
    with pytest.raises(AllSkippedError, match=r"oversize: 40.*seq_length \(the pack width\) may be too small"):
        list(get_loader(_dataset(path, te)))


def test_wrong_encoder_for_the_data_fails_fast(demo_shards):
    """The text encoder on Qwen-VL chat shards: every record lacks prompt/completion."""
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=1024, skip_guard=30)
    with pytest.raises(AllSkippedError, match=r"missing_field: 30.*right task encoder"):
        list(get_loader(_dataset(demo_shards, te)))


# ------------------------------------------------------------------ skip-rate warning
def test_skip_rate_warning_once_per_worker_with_reasons_and_examples(tmp_path, caplog):
    records = [GOOD if i % 5 == 0 else {"question": f"q{i}"} for i in range(300)]  # 80% missing_field
    path = _jsonl(tmp_path, records)
    te = TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
    assert (te.packing.skip_warn_rate, te.packing.skip_warn_window) == (0.5, 200)
    with caplog.at_level(logging.WARNING, logger="energon_pack"), pytest.warns(RuntimeWarning) as rec:
        batches = list(get_loader(_dataset(path, te)))
    assert sum(len(b["__keys__"]) for b in batches) == 60  # nothing lost: the warning does not stop the stream
    messages = [str(w.message) for w in rec if "samples were skipped" in str(w.message)]
    assert len(messages) == 1 and messages == [
        r.getMessage() for r in caplog.records if "samples were skipped" in r.getMessage()
    ]
    assert messages[0].startswith(
        "rank 0 worker 0: 160 of the last 200 samples were skipped (80%, at or above "
        "skip_warn_rate 50%); skips by reason so far: missing_field: 16"
    )
    assert "one example per reason: missing_field: 1: no 'prompt' field (has ['question'])" in messages[0]


def test_no_skip_rate_warning_below_the_rate_or_when_off(tmp_path):
    mostly_good = _jsonl(tmp_path, [GOOD if i % 5 else {"question": "q"} for i in range(300)], "ok.jsonl")  # 20%
    mostly_bad = _jsonl(tmp_path, [GOOD if i % 5 == 0 else {"question": "q"} for i in range(300)], "bad.jsonl")
    for path, knobs in ((mostly_good, {}), (mostly_bad, {"skip_warn_rate": None})):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            list(get_loader(_dataset(path, TextPackingTaskEncoder(tokenizer="demo", seq_length=256, **knobs))))
    with pytest.raises(ConfigError, match="skip_warn_rate"):
        PackingConfig(skip_warn_rate=1.5)
    with pytest.raises(ConfigError, match="skip_warn_window"):
        PackingConfig(skip_warn_window=0)


def test_our_errors_cross_process_boundaries_intact():
    """Worker processes send exceptions to the parent by pickling: type, message and attributes
    must survive (ConfigError's constructor takes three arguments, its args hold one message)."""
    import pickle

    from energon_pack.energon.fingerprint import ResumeConfigError
    from energon_pack.errors import ConfigError, SampleSkipped

    for exc in (
        ConfigError("width", "too small", "raise it"),
        SampleSkipped("corrupt_image", "bad header"),
        ResumeConfigError("packing_buffer_size", "changed", "keep 16"),
        ResumeConfigError("worker said: ResumeConfigError: seq_length: changed"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)
    assert pickle.loads(pickle.dumps(ConfigError("a", "b", "c"))).fix == "c"


def test_the_balance_default_follows_the_mode_and_the_tokens_packer_knobs():
    """Unset, balance is "compute" in carry mode; "tokens" in rounds mode or where a knob only the tokens-only packer
    has is set (never silently ignored); those knobs with balance="compute" are one error naming the knob."""
    assert PackingConfig().balance == "compute" and PackingConfig(packing_mode="rounds").balance == "tokens"
    for knob, value in (("lookahead_packs", 2.0), ("min_fill", 0.9), ("max_age", 50)):
        assert PackingConfig(**{knob: value}).balance == "tokens"
        with pytest.raises(ConfigError, match=rf"{knob}: is a knob of the tokens-only carry packer") as err:
            PackingConfig(balance="compute", **{knob: value})
        assert err.value.knob == knob and "balance='tokens'" in err.value.fix
    encoder = TextPackingTaskEncoder(tokenizer="demo", seq_length=256, min_fill=0.9)
    assert encoder.packing.balance == "tokens" and encoder.make_packer(8).__class__.__name__ == "OnlinePacker"
    # a defaulted balance is derived again when a config is rebuilt with another mode or knob
    assert PackingConfig.build(PackingConfig(), packing_mode="rounds").balance == "tokens"
    assert PackingConfig.build(PackingConfig(min_fill=0.9), min_fill=None).balance == "compute"
    assert PackingConfig.build(PackingConfig(balance="tokens")).balance == "tokens"
