"""JsonlSFTDataset: bad lines counted with line numbers, overlength policies, index/length caches."""

import json
import os

import numpy as np
import pytest

from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft.dataset import PADDING_INDEX, PADDING_KEY, JsonlSFTDataset
from energon_pack.sft.index import LineIndex, scan_line_ends

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
    lines = [GOOD, b"{not json", b'{"prompt": "\xff", "completion": "x"}', b"   ", {"prompt": "x"},
             {"prompt": "x", "completion": ""}, {"prompt": "x " * 40, "completion": "y"}, GOOD]
    path = write(tmp_path / "d.jsonl", lines, end=b"")  # last line without newline
    ds = JsonlSFTDataset(path, TOK, max_length=16)
    assert len(ds) == 8
    assert ds.lengths.tolist()[0] == 7 and ds.lengths.tolist()[7] == 7
    assert [(n, r) for n, r, _ in ds.skipped_lines] == [
        (2, "invalid_json"), (3, "invalid_utf8"), (4, "empty_line"), (5, "missing_field"),
        (6, "empty_completion"), (7, "too_long")]
    assert ds.skips == {"invalid_json": 1, "invalid_utf8": 1, "empty_line": 1, "missing_field": 1,
                        "empty_completion": 1, "too_long": 1}
    assert ds.skipped_lines[5][2].startswith("line 7: 81 tokens > max_length 16")
    with pytest.raises(SampleSkipped) as info:
        ds[1]
    assert info.value.reason == "invalid_json" and info.value.detail.startswith("line 2:")
    chat = JsonlSFTDataset(write(tmp_path / "c.jsonl", [chat_no_assistant, {"messages": "x"}]), TOK, format="chat")
    assert [(n, r) for n, r, _ in chat.skipped_lines] == [(1, "no_assistant_turn"), (2, "bad_conversation")]


def test_overlength_truncate_and_error(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD, {"prompt": "Hi", "completion": "x " * 40}, {"prompt": "x " * 40, "completion": "y"}])
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
    idx_file = tmp_path / "d.jsonl.idx.npy"
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
    (tmp_path / "d.jsonl.idx.npy").write_bytes(b"garbage")
    for f in tmp_path.glob("d.jsonl.len-*.npy"):
        f.write_bytes(b"\x93NUMPY garbage")
    ds = JsonlSFTDataset(path, TOK)
    assert len(ds) == 3 and ds.lengths.tolist() == [7, 7, 7]
    assert len(np.load(tmp_path / "d.jsonl.idx.npy")) == 3
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
    for fresh in (True, False):  # computed by the pass, then loaded from the cache files
        cached = JsonlSFTDataset(path, TOK, max_length=20, overlength="truncate", cache_tokens=True)
        assert cached.lengths.tolist() == lazy.lengths.tolist() == [7, -1, 7, 20]
        for ds in (cached, pickle.loads(pickle.dumps(cached))):
            for i in (0, 2, 3):
                a, b = ds[i], lazy[i]
                assert a.input_ids.tolist() == b.input_ids.tolist() and a.target_mask.tolist() == b.target_mask.tolist()
                assert a.key == b.key == i + 1
            with pytest.raises(SampleSkipped, match="line 2"):
                ds[1]
    assert len(list(tmp_path.glob("d.jsonl.tok-*.npy"))) == 1
