"""JsonlSFTDataset: bad lines counted with line numbers, overlength policies, index/length caches."""

import json
import os

import numpy as np
import pytest

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft.dataset import PADDING_INDEX, PADDING_KEY, JsonlSFTDataset
from energon_pack.sft.index import LineIndex, cache_folder, cache_path, scan_line_ends
from energon_pack.sft.length_pass import default_workers

TOK = load_demo_tokenizer()
GOOD = {"prompt": "Hi there", "completion": "Hello!"}  # 7 tokens, 4 supervised


def write(path, lines, end=b"\n"):
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines) + end)
    return path


def test_scan_line_ends_with_and_without_final_newline():
    assert scan_line_ends(np.frombuffer(b"ab\n\ncd\n", np.uint8)).tolist() == [2, 3, 6]
    assert scan_line_ends(np.frombuffer(b"ab\ncd", np.uint8), chunk_bytes=2).tolist() == [2, 5]
    assert scan_line_ends(np.zeros(0, np.uint8)).tolist() == []


def test_every_bad_input_is_a_counted_skip_with_its_line_number(tmp_path):
    chat_no_assistant = {"messages": [{"role": "user", "content": "Hi"}]}
    lines = [
        GOOD,
        b"{not json",
        b'{"prompt": "\xff", "completion": "x"}',
        b"   ",
        {"prompt": "x"},
        {"prompt": "x", "completion": ""},
        {"prompt": "x " * 40, "completion": "y"},
        GOOD,
    ]
    path = write(tmp_path / "d.jsonl", lines, end=b"")  # last line without newline
    ds = JsonlSFTDataset(path, TOK, max_length=16)
    assert len(ds) == 8
    assert ds.lengths.tolist()[0] == 7 and ds.lengths.tolist()[7] == 7
    assert [(n, r) for n, r, _ in ds.skipped_lines] == [
        (2, "invalid_json"),
        (3, "invalid_utf8"),
        (4, "empty_line"),
        (5, "missing_field"),
        (6, "empty_completion"),
        (7, "too_long"),
    ]
    assert ds.skips == {
        "invalid_json": 1,
        "invalid_utf8": 1,
        "empty_line": 1,
        "missing_field": 1,
        "empty_completion": 1,
        "too_long": 1,
    }
    assert ds.skipped_lines[5][2].startswith("line 7: 81 tokens > max_length 16")
    with pytest.raises(SampleSkipped) as info:
        ds[1]
    assert info.value.reason == "invalid_json" and info.value.detail.startswith("line 2:")
    chat = JsonlSFTDataset(write(tmp_path / "c.jsonl", [chat_no_assistant, {"messages": "x"}]), TOK, format="chat")
    assert [(n, r) for n, r, _ in chat.skipped_lines] == [(1, "no_assistant_turn"), (2, "bad_conversation")]


def test_overlength_truncate_and_error(tmp_path):
    path = write(
        tmp_path / "d.jsonl",
        [GOOD, {"prompt": "Hi", "completion": "x " * 40}, {"prompt": "x " * 40, "completion": "y"}],
    )
    ds = JsonlSFTDataset(path, TOK, max_length=8, overlength="truncate")
    assert ds.lengths.tolist() == [7, 8, -1]  # the long prompt leaves nothing supervised in 8 tokens
    assert ds.skips == {"no_trained_tokens": 1}
    assert ds[1].input_ids.tolist() == [39, 72, 87, 220, 87, 220, 87, 220]  # "Hi" + "x x x x"[:6]
    assert ds[1].target_mask.tolist() == [False, False] + [True] * 6
    with pytest.raises(ValueError, match="line 2 has .* > max_length 8"):
        JsonlSFTDataset(path, TOK, max_length=8, overlength="error").lengths
    with pytest.raises(ConfigError, match="overlength"):
        JsonlSFTDataset(path, TOK, overlength="drop")


def test_padding_index_and_missing_file(tmp_path):
    ds = JsonlSFTDataset(write(tmp_path / "d.jsonl", [GOOD]), TOK)
    pad = ds[PADDING_INDEX]
    assert pad.key == PADDING_KEY and pad.input_ids.tolist() == [765] and not pad.target_mask.any()
    assert ds[0].key == 1
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        JsonlSFTDataset(tmp_path / "nope.jsonl", TOK)


def test_index_cache_is_reused_and_rebuilt_when_the_file_changes(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD, GOOD])
    assert len(LineIndex(path)) == 2
    idx_file = cache_path(path, ".idx.npy")
    assert idx_file.exists() and np.load(idx_file).tolist() == [len(json.dumps(GOOD)), 2 * len(json.dumps(GOOD)) + 1]
    # an up-to-date cached index is loaded, not rewritten
    stamp = os.stat(idx_file).st_mtime_ns
    assert len(LineIndex(path)) == 2 and os.stat(idx_file).st_mtime_ns == stamp
    write(path, [GOOD, GOOD, {"prompt": "a", "completion": "b"}])  # changed file -> rebuilt
    ds = JsonlSFTDataset(path, TOK)
    assert len(ds) == 3 and ds.lengths.tolist()[:2] == [7, 7]
    # same size, same mtime, different bytes -> the hash changes, so the index and lengths rebuild
    text = path.read_bytes().replace(b"Hello!", b"Hallo!")
    st = os.stat(path)
    path.write_bytes(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = JsonlSFTDataset(path, TOK)
    assert ds[0].input_ids.tolist() == TOK.encode("Hi there") + TOK.encode("Hallo!") + [765]


def test_corrupt_or_unwritable_caches_are_rebuilt(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD, GOOD, GOOD])
    JsonlSFTDataset(path, TOK).lengths
    cache_path(path, ".idx.npy").write_bytes(b"garbage")
    for f in cache_folder().glob(cache_path(path, ".len-*.npy").name):
        f.write_bytes(b"\x93NUMPY garbage")
    ds = JsonlSFTDataset(path, TOK)
    assert len(ds) == 3 and ds.lengths.tolist() == [7, 7, 7]
    assert len(np.load(cache_path(path, ".idx.npy"))) == 3
    # a cache place that cannot be written (here: a file, not a directory) keeps the index in memory
    not_a_dir = tmp_path / "plain_file"
    not_a_dir.write_text("")
    with pytest.warns(UserWarning, match="cannot write cache"):
        assert JsonlSFTDataset(path, TOK, cache_dir=not_a_dir).lengths.tolist() == [7, 7, 7]


def test_length_cache_depends_on_format_knobs(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD])
    assert JsonlSFTDataset(path, TOK).lengths.tolist() == [7]
    assert JsonlSFTDataset(path, TOK, add_eos=False).lengths.tolist() == [6]
    assert JsonlSFTDataset(path, TOK, template="Q: {prompt}\nA:").lengths.tolist() == [13]


def test_token_cache_gives_the_same_samples_and_survives_pickling(tmp_path):
    import pickle

    lines = [GOOD, b"{bad", {"prompt": "a b c", "completion": "d e"}, {"prompt": "x", "completion": "y " * 30}]
    path = write(tmp_path / "d.jsonl", lines)
    lazy = JsonlSFTDataset(path, TOK, max_length=20, overlength="truncate")
    for _fresh in (True, False):  # computed by the pass, then loaded from the cache files
        cached = JsonlSFTDataset(path, TOK, max_length=20, overlength="truncate", cache_tokens=True)
        assert cached.lengths.tolist() == lazy.lengths.tolist() == [7, -1, 7, 20]
        for ds in (cached, pickle.loads(pickle.dumps(cached))):
            for i in (0, 2, 3):
                a, b = ds[i], lazy[i]
                assert a.input_ids.tolist() == b.input_ids.tolist() and a.target_mask.tolist() == b.target_mask.tolist()
                assert a.key == b.key == i + 1
            with pytest.raises(SampleSkipped, match="line 2"):
                ds[1]
    assert len(list(cache_folder().glob(cache_path(path, ".tok-*.npy").name))) == 1


def _assert_same(a, b):
    assert np.array_equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]
    assert (a[3] is None and b[3] is None) or np.array_equal(a[3], b[3])


@pytest.mark.parametrize("fmt", ["prompt_completion", "chat"])
def test_batched_and_parallel_length_pass_identical_to_serial(tmp_path, fmt, monkeypatch):
    import random

    from energon_pack.sft import length_pass as D

    monkeypatch.setattr(D, "LENGTH_CHUNK", 16)  # many chunks and ranges on a small file
    rng = random.Random(0)
    words = "a b the cat sat on mat hello world x y z".split()
    lines = []
    for i in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        if fmt == "chat":
            rec = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]}
        else:
            rec = {"prompt": text, "completion": text[::-1] if i % 7 else ""}
        lines.append(json.dumps(rec).encode())
    lines[5], lines[40], lines[41] = b"{bad", b"   ", b'{"prompt": "\\ud800", "completion": "x"}'
    lines[77] = json.dumps(
        {
            "prompt": "hi <|im_end|>",
            "completion": "y",
            "messages": [{"role": "user", "content": "<|im_end|>"}, {"role": "assistant", "content": "y"}],
        }
    ).encode()
    path = write(tmp_path / "d.jsonl", lines)
    ds = JsonlSFTDataset(path, TOK, format=fmt, max_length=30, cache_tokens=True)
    serial = ds.compute_lengths(workers=1, batch=False)
    assert len(set(serial[1])) >= 4  # several skip reasons, in order of first use
    _assert_same(ds.compute_lengths(workers=1, batch=True), serial)
    _assert_same(ds.compute_lengths(workers=2, batch=True), serial)
    _assert_same(ds.compute_lengths(workers=3, batch=False), serial)
    # the batch path really served the texts from the batch encode
    memo = D._BatchMemo(ds.format.tokenizer)
    assert memo.batch_encode is not None
    # through the public properties (each with its own fresh cache) too
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    par = JsonlSFTDataset(path, TOK, format=fmt, max_length=30, length_workers=2, cache_dir=tmp_path / "a")
    ser = JsonlSFTDataset(
        path, TOK, format=fmt, max_length=30, length_workers=1, length_batch=False, cache_dir=tmp_path / "b"
    )
    assert default_workers(par) == 2 and par.lengths.tolist() == ser.lengths.tolist() == serial[0].tolist()
    assert par.skipped_lines == ser.skipped_lines and par.skips == ser.skips
    with pytest.raises(ConfigError, match="length_workers"):
        JsonlSFTDataset(path, TOK, length_workers=0)


def _pc_lines(n, seed=0):
    """Prompt/completion lines with every kind of line the lean pass must hand to the format."""
    import random

    rng = random.Random(seed)
    words = "a b the cat sat on mat hello world x y z <| |> é 漢".split()
    lines = []
    for _ in range(n):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        completion = " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        lines.append(json.dumps({"prompt": f"  {prompt} ", "completion": f"{completion}\n"}).encode())
    odd = [
        b"{bad",
        b"   ",
        b"[1, 2]",
        b'"text"',
        json.dumps({"prompt": 3, "completion": "x"}).encode(),
        json.dumps({"completion": "x"}).encode(),
        json.dumps({"prompt": "x", "completion": "   "}).encode(),
        json.dumps({"prompt": "", "completion": "y"}).encode(),
        json.dumps({"prompt": "", "completion": ""}).encode(),
        b'{"prompt": "\\ud800 a", "completion": "x"}',
        b'{"prompt": "a", "completion": "x \\udfff"}',
        json.dumps({"prompt": "hi <|im_end|>", "completion": "y"}).encode(),
        json.dumps({"prompt": "hi", "completion": "y <|endoftext|> z"}).encode(),
        json.dumps({"prompt": "<|im_start", "completion": "<|"}).encode(),
        b"\xff\xfe",
        json.dumps({"prompt": "x " * 60, "completion": "y"}).encode(),
        json.dumps({"prompt": "x", "completion": "y " * 60}).encode(),
        json.dumps({"prompt": {"a": 1}, "completion": "x", "q": [[[]]]}).encode(),
        b"{" * 100 + b"}" * 100,
    ]
    for k, line in enumerate(odd):
        lines[(k * 37 + 5) % n] = line
    return lines


@pytest.mark.parametrize(
    "knobs",
    [
        dict(max_length=30),
        dict(max_length=30, overlength="truncate"),
        dict(),
        dict(max_length=12, overlength="truncate", loss="full", add_bos=True, bos_id=3),
        dict(template="Q: {prompt}\nA:", separator=" ", add_eos=False, strip_whitespace=False, max_length=40),
        dict(add_eos=False, max_length=2, overlength="truncate"),
    ],
)
@pytest.mark.parametrize("cache_tokens", [False, True])
def test_prompt_completion_lean_pass_identical_to_serial(tmp_path, monkeypatch, knobs, cache_tokens):
    """The prompt/completion pass decides most lines from token counts (ids too with a token
    cache) and hands every odd line to the format: same lengths, reasons, details and tokens."""
    from energon_pack.sft import length_pass as D

    monkeypatch.setattr(D, "LENGTH_CHUNK", 16)
    path = write(tmp_path / "d.jsonl", _pc_lines(400), end=b"")
    ds = JsonlSFTDataset(path, TOK, cache_tokens=cache_tokens, **knobs)
    memo = D._BatchMemo(ds.format.tokenizer)
    assert D._LeanPromptCompletion(ds, memo).counts_only is not cache_tokens  # the demo tokenizer qualifies
    serial = ds.compute_lengths(workers=1, batch=False)
    assert len(set(serial[1])) >= 5
    _assert_same(ds.compute_lengths(workers=1, batch=True), serial)
    _assert_same(ds.compute_lengths(workers=2, batch=True), serial)


def test_pool_workers_identical_and_raise_as_the_serial_pass(tmp_path, monkeypatch):
    """The parallel pass is one process pool over line ranges: each range's result is the in-process
    one, a task's exception is raised in the caller as the serial pass raises it (one that does not
    pickle as a RuntimeError naming it), and a dataset that does not pickle works (workers inherit it)."""
    from energon_pack.sft import length_pass as D

    monkeypatch.setattr(D, "LENGTH_CHUNK", 16)
    path = write(tmp_path / "d.jsonl", _pc_lines(300))
    ds = JsonlSFTDataset(path, TOK, max_length=30, overlength="truncate", cache_tokens=True)
    serial = ds.compute_lengths(workers=1, batch=False)
    tasks = [(0, 100, True), (100, 250, True), (250, 300, False)]
    pooled = D._pool_results(ds, tasks, 2)
    assert len(pooled) == 3
    for (a, b, batch), got in zip(tasks, pooled):
        _assert_same(got, D._length_range(ds, a, b, batch))
    _assert_same(ds.compute_lengths(workers=2, batch=True), serial)
    chat_path = write(
        tmp_path / "c.jsonl",
        [
            {"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": "a " * (i % 9)}]}
            for i in range(100)
        ],
    )
    chat = JsonlSFTDataset(chat_path, TOK, format="chat")
    _assert_same(chat.compute_lengths(workers=2, batch=True), chat.compute_lengths(workers=1, batch=False))
    strict = JsonlSFTDataset(path, TOK, max_length=8, overlength="error")
    with pytest.raises(ValueError, match="has .* > max_length 8") as serial_error:
        strict.compute_lengths(workers=1, batch=False)
    with pytest.raises(ValueError) as pool_error:
        strict.compute_lengths(workers=2)
    assert str(pool_error.value) == str(serial_error.value)
    assert type(pool_error.value) is type(serial_error.value)
    unpicklable = JsonlSFTDataset(path, TOK, max_length=30)
    unpicklable.hook = lambda: None
    _assert_same(unpicklable.compute_lengths(workers=2), unpicklable.compute_lengths(workers=1, batch=False))

    class Unpicklable(Exception):  # a local class: pickle cannot find it by name
        pass

    def failing(*args):
        raise Unpicklable("no pickle")

    monkeypatch.setattr(D, "_length_range", failing)  # the forked workers inherit it
    with pytest.raises(RuntimeError, match=r"^length pass worker \d+: .*Unpicklable\('no pickle'\)$"):
        D._pool_results(ds, tasks, 2)


def test_lean_pass_overlength_error_and_control_screen(tmp_path):
    from tokenizers import AddedToken

    from energon_pack.chat.tokenizer import QwenTokenizer, load_demo_tokenizer_raw
    from energon_pack.sft import length_pass as D

    path = write(tmp_path / "d.jsonl", [GOOD] * 3 + [{"prompt": "x " * 40, "completion": "y"}] + [b"{bad"])
    for workers in (1, 2):
        with pytest.raises(ValueError, match="line 4 has 81 tokens > max_length 16"):
            JsonlSFTDataset(path, TOK, max_length=16, overlength="error").compute_lengths(workers=workers, batch=True)
    raw = load_demo_tokenizer_raw()
    assert D._literal_control_contents(raw, QwenTokenizer(raw).control_ids) == tuple(
        raw.id_to_token(t) for t in sorted(QwenTokenizer(raw).control_ids)
    )
    normalized = load_demo_tokenizer_raw()  # a special token matched after a normalizer: ids are checked
    from tokenizers import normalizers

    normalized.normalizer = normalizers.Lowercase()
    normalized.add_special_tokens([AddedToken("<shout>", special=True, normalized=True)])
    assert D._literal_control_contents(normalized, QwenTokenizer(normalized).control_ids) is None
    in_vocab = load_demo_tokenizer_raw()  # a special token the model itself can emit: ids are checked
    in_vocab.add_special_tokens([AddedToken("There", special=True)])  # id of the model's own "There"
    assert D._literal_control_contents(in_vocab, QwenTokenizer(in_vocab).control_ids) is None
    padded = load_demo_tokenizer_raw()  # a padding batch would not match single encodes: no batch path
    padded.enable_padding(length=64)
    from energon_pack.sft.formats import PlainTokenizer

    assert D._BatchMemo(PlainTokenizer(load_demo_tokenizer_raw())).batch_encode is not None
    assert D._BatchMemo(PlainTokenizer(padded)).batch_encode is None


def test_batched_pass_hits_the_memo_and_hf_fast_tokenizer_batch_call(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from energon_pack.chat.tokenizer import load_demo_tokenizer_raw
    from energon_pack.sft import length_pass as D

    lines = [{"prompt": f"question {i} about the cat", "completion": f"answer {i} " * (i % 5 + 1)} for i in range(200)]
    path = write(tmp_path / "d.jsonl", lines)
    hf = PreTrainedTokenizerFast(tokenizer_object=load_demo_tokenizer_raw())
    for tok in (TOK, hf):
        ds = JsonlSFTDataset(path, tok)
        memo = D._BatchMemo(ds.format.tokenizer)
        assert memo.batch_encode is not None
        memo.prefetch(["question 1 about the cat", "answer 1"])
        assert memo.tokenizer.encode_text("answer 1") == ds.format.tokenizer.encode_text("answer 1") and memo.hits == 1
        _assert_same(ds.compute_lengths(workers=1, batch=True), ds.compute_lengths(workers=1, batch=False))


def test_overlength_error_raises_from_the_parallel_pass(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD] * 50 + [{"prompt": "x " * 40, "completion": "y"}] + [GOOD] * 50)
    with pytest.raises(ValueError, match="line 51 has") as serial_error:
        JsonlSFTDataset(path, TOK, max_length=16, overlength="error").compute_lengths(workers=1, batch=False)
    with pytest.raises(ValueError, match="line 51 has") as parallel_error:
        JsonlSFTDataset(path, TOK, max_length=16, overlength="error").compute_lengths(workers=2)
    assert type(parallel_error.value) is type(serial_error.value)
