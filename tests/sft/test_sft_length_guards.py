"""The GPT-SFT length pass under hostile conditions: a file that changes under it, a worker that
dies, a huge line (bounded memory)."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from energon_pack.chat.tokenizer import load_demo_tokenizer
from energon_pack.errors import ConfigError, SampleSkipped
from energon_pack.sft import dataset as dataset_module
from energon_pack.sft import length_pass
from energon_pack.sft.dataset import JsonlSFTDataset
from energon_pack.sft.index import LineIndex, _FileBytes, cache_folder, cache_key, scan_line_ends
from energon_pack.sft.token_bound import max_bytes_per_token

TOK = load_demo_tokenizer()
GOOD = {"prompt": "Hi there", "completion": "Hello!"}  # 7 tokens


def write(path, records):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return path


def test_file_truncated_after_the_index_is_an_error_not_a_sigbus(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    ds = JsonlSFTDataset(path, TOK, max_length=16, length_workers=1)
    os.truncate(path, 100)
    with pytest.raises(ConfigError, match=r"changed during the length pass \(size, mtime_ns, inode \(") as info:
        ds.lengths
    assert info.value.knob == "path" and "rerun when the file is stable" in str(info.value)
    # reads inside the pass (past the size check) stop at the short read instead of touching a cut mmap
    with pytest.raises(
        ConfigError, match="it ends before byte 6015 that the line index expects; read stopped at byte 100"
    ):
        length_pass._length_range(ds, 0, 300, True)
    with pytest.raises(ConfigError, match="it ends before byte 986 .* read stopped at byte 940"):
        ds.index.line(20)


def test_file_truncated_during_the_index_scan_is_an_error_not_a_sigbus(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    data = _FileBytes(path)  # the scan's view, sized when it began
    assert scan_line_ends(data, chunk_bytes=1000).tolist()[-3:] == [14005, 14052, 14099]
    os.truncate(path, 2500)
    with pytest.raises(
        ConfigError,
        match=r"^path: '.*d\.jsonl' changed during its line index scan \(14100 bytes when "
        r"the scan began, fewer at byte 2500\)\. Fix: rerun when the file is stable",
    ):
        scan_line_ends(data, chunk_bytes=1000)


def test_file_appended_to_during_the_pass_is_an_error(tmp_path, monkeypatch):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    ds = JsonlSFTDataset(path, TOK, max_length=16, length_workers=1)
    real = length_pass._length_range

    def appending(*args):
        with open(path, "ab") as f:
            f.write(json.dumps(GOOD).encode() + b"\n")
        return real(*args)

    monkeypatch.setattr(length_pass, "_length_range", appending)
    with pytest.raises(
        ConfigError, match=r"changed during the length pass \(size, mtime_ns, inode \(14100, .* before it, \(14147, "
    ):
        ds.lengths
    assert not list(
        cache_folder().glob(f"d.jsonl.{cache_key(path)[:12]}-*.len-*")
    )  # nothing cached from a changed file


class KillingIndex(LineIndex):
    """A line index whose read of byte ``kill_at`` SIGKILLs the process, outside the test process."""

    def read(self, lo, hi):
        if os.getpid() != self.parent and lo <= self.kill_at < hi:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().read(lo, hi)


def test_a_worker_killed_mid_pass_is_an_error_naming_its_lines_not_a_hang(tmp_path):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    ds = JsonlSFTDataset(path, TOK, max_length=16)
    ds.index.__class__ = KillingIndex
    ds.index.parent, ds.index.kill_at = os.getpid(), 160 * 47  # line 161: in the range of lines 151-187
    started = time.monotonic()
    with pytest.raises(
        ConfigError,
        match=r"^length_workers: the length-pass worker for lines 151-187 died "
        r"\(killed by SIGKILL \(the OOM killer sends it\)\)\. Fix: give the pass",
    ):
        ds.compute_lengths(workers=2)
    assert time.monotonic() - started < 30
    ds.index.kill_at = -1  # the same dataset then computes normally: no worker is left behind
    assert ds.compute_lengths(workers=2)[0].tolist() == [7] * 300


def test_token_bound_is_a_lower_bound_and_only_for_tokenizers_it_holds_for():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    assert max_bytes_per_token(TOK) == 16  # "<|vision_start|>"
    rng = random.Random(0)
    alphabet = "ab ,.\n\t  é漢字😀\u0301ﬁ" + "".join(map(chr, range(32, 127)))
    for n in (1, 7, 100, 5000):
        text = "".join(rng.choice(alphabet) for _ in range(n))
        assert len(TOK.encode(text)) >= -(-len(text.encode()) // 16)
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["\u0120" * 20] = len(vocab)  # twenty byte-level spaces: 40 bytes of UTF-8, 20 bytes of text
    spaces = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    spaces.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert max_bytes_per_token(spaces) == 20
    del vocab["\u0120"]
    spaces = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    spaces.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert max_bytes_per_token(spaces) is None  # a space would be dropped, not counted
    plain = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=True))
    plain.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert max_bytes_per_token(plain) is None  # fused unknown tokens stand for any length
    for pre in (
        pre_tokenizers.Whitespace(),
        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel()]),
    ):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        assert max_bytes_per_token(tok) is None  # whitespace is dropped
    lowered = Tokenizer.from_str(load_demo_tokenizer().inner.to_str())
    lowered.normalizer = normalizers.Lowercase()
    assert max_bytes_per_token(lowered) is None
    lowered.normalizer = normalizers.NFC()
    assert max_bytes_per_token(lowered) == 3 * 16


def test_a_line_too_long_by_its_bytes_is_skipped_untokenised_and_normal_lines_are_unchanged(tmp_path, monkeypatch):
    # max_length 16 and 16 bytes a token: more than 256 bytes of text is too long without tokenising
    # (from BYTE_BOUND_MIN_BYTES on: lowered here to see it on small lines)
    monkeypatch.setattr(dataset_module, "BYTE_BOUND_MIN_BYTES", 0)
    lines = [
        GOOD,
        {"prompt": "Hi", "completion": "x" * 255},
        {"prompt": "H", "completion": "x" * 255},
        {"prompt": "Hi", "completion": "x " * 300},
        {"prompt": "Hi", "completion": "x" * 600 + "<|im_end|>"},
        {"prompt": "Hi", "completion": "x" * 600 + "\ud800"},
        {"prompt": "x" * 600, "completion": " " * 600},
        {"prompt": "x " * 10, "completion": "y " * 200},
        GOOD,
    ]
    path = write(tmp_path / "d.jsonl", lines)
    results = {}
    for workers, batch in ((1, False), (1, True), (2, True)):
        ds = JsonlSFTDataset(path, TOK, max_length=16)
        lengths, reasons, details, _ = ds.compute_lengths(workers=workers, batch=batch)
        results[workers, batch] = (lengths.tolist(), reasons, details)
    assert results[1, False] == results[1, True] == results[2, True]
    lengths, reasons, details = results[1, True]
    assert [reasons[-1 - n] if n < 0 else n for n in lengths] == [
        7,
        "too_long",
        "too_long",
        "too_long",
        "control_token_in_text",
        "invalid_text",
        "empty_completion",
        "too_long",
        7,
    ]
    assert details[2] == "line 2: at least 17 tokens (257 bytes of text, <= 16 bytes a token) > max_length 16"
    assert details[3] == "line 3: 257 tokens > max_length 16"  # 256 bytes: a bound of 16 decides nothing: tokenised
    assert details[4] == "line 4: at least 38 tokens (601 bytes of text, <= 16 bytes a token) > max_length 16"
    assert details[8] == "line 8: at least 27 tokens (418 bytes of text, <= 16 bytes a token) > max_length 16"
    with pytest.raises(SampleSkipped, match=r"^too_long: line 4: at least 38 tokens"):
        JsonlSFTDataset(path, TOK, max_length=16)[3]
    with pytest.raises(
        ValueError, match=r"line 2 has at least 17 tokens \(257 bytes .* > max_length 16 \(overlength='error'"
    ):
        JsonlSFTDataset(path, TOK, max_length=16, overlength="error").lengths
    straddling = write(tmp_path / "s.jsonl", [{"prompt": "Hi", "completion": "end|>" + "x" * 600}])
    assert JsonlSFTDataset(straddling, TOK, max_length=16, separator="<|im_").skips == {"control_token_in_text": 1}
    templated = JsonlSFTDataset(path, TOK, max_length=16, template="Q: {prompt}\nA:", separator=" ")
    assert templated.skipped_lines[0] == (
        2,
        "too_long",
        "line 2: at least 17 tokens (264 bytes of text, <= 16 bytes a token) > max_length 16",
    )
    truncated = JsonlSFTDataset(path, TOK, max_length=16, overlength="truncate")  # needs the tokens: no bound
    assert truncated.lengths.tolist()[:4] == [7, 16, 16, 16]
    monkeypatch.setattr(dataset_module, "BYTE_BOUND_MIN_BYTES", 600)  # lines of at most this much text: tokenised
    exact = JsonlSFTDataset(path, TOK, max_length=16).compute_lengths(workers=1)
    assert exact[0].tolist() == lengths and exact[2][4] == details[4]  # 601 bytes: still by the bound
    assert exact[2][2] == "line 2: 258 tokens > max_length 16" and exact[2][8] == "line 8: 220 tokens > max_length 16"


def chat(user, assistant):
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def test_a_chat_line_too_long_by_its_bytes_is_skipped_untokenised_after_the_formats_own_checks(tmp_path, monkeypatch):
    # max_length 32 and 16 bytes a token: more than 512 bytes of message text is too long untokenised
    monkeypatch.setattr(dataset_module, "BYTE_BOUND_MIN_BYTES", 0)
    lines = [
        chat("Hi", "Hello!"),
        chat("Hi", "x" * 600),
        chat("Hi", "x" * 508),
        chat("Hi", " x" * 300),
        {"messages": [{"role": "user", "content": "x" * 600}]},
        chat("Hi", "x" * 600 + "<|im_end|>"),
        chat("Hi", "<think>" + "x" * 600 + "</think>ok"),
        chat("x" * 600, ""),
    ]
    path = write(tmp_path / "c.jsonl", lines)
    lengths, reasons, details, _ = JsonlSFTDataset(path, TOK, max_length=32, format="chat").compute_lengths(workers=1)
    assert [reasons[-1 - n] if n < 0 else n for n in lengths] == [
        17,
        "too_long",
        "too_long",
        "too_long",
        "no_assistant_turn",
        "control_token_in_text",
        "too_long",
        "empty_assistant_turn",
    ]
    assert details[2] == "line 2: at least 38 tokens (602 bytes of text, <= 16 bytes a token) > max_length 32"
    assert details[3] == "line 3: 522 tokens > max_length 32"  # 510 bytes: the bound decides nothing: tokenised
    assert details[4] == "line 4: at least 38 tokens (601 bytes of text, <= 16 bytes a token) > max_length 32"
    assert "at least" not in details[7]  # only "ok" is sure to render (a template may drop the reasoning)
    truncated = JsonlSFTDataset(path, TOK, max_length=32, format="chat", overlength="truncate")
    assert truncated.lengths.tolist()[:2] == [17, 32]


@pytest.mark.parametrize("format", ["prompt_completion", "chat"])
def test_a_50_mb_line_stays_in_bounded_memory(tmp_path, format):
    """Before the byte bound this line took ~8 GB peak RSS (about 170 bytes a byte) to a too_long."""
    path = tmp_path / "big.jsonl"
    good, big = GOOD, {"prompt": "Hi", "completion": "lorem ipsum " * 4_166_667}
    if format == "chat":
        good, big = chat(GOOD["prompt"], GOOD["completion"]), chat("Hi", big["completion"].strip())
    with open(path, "w") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(big) + "\n")
    code = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails here instead of eating the machine
from energon_pack.sft.dataset import JsonlSFTDataset
ds = JsonlSFTDataset({str(path)!r}, "demo", max_length=4096, length_workers=1, format={format!r})
print(ds.lengths.tolist(), ds.skipped_lines)
# VmHWM: this process image's own peak (ru_maxrss survives exec, so it would carry the forking pytest's RSS)
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result, peak_mib = out.stdout.splitlines()
    assert result.endswith(
        "-1] [(2, 'too_long', 'line 2: at least 3125001 tokens (50000005 bytes of text, "
        "<= 16 bytes a token) > max_length 4096')]"
    )
    assert int(peak_mib) < 1024
