"""The GPT-SFT length pass under hostile conditions: a file that changes under it, a worker that
dies, a huge line (bounded memory)."""

import json
import os
import signal
import time

import pytest

from energon_pack.errors import ConfigError
from energon_pack.qwen_vl import load_demo_tokenizer
from energon_pack.sft import length_pass
from energon_pack.sft.dataset import JsonlSFTDataset
from energon_pack.sft.index import LineIndex

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
    with pytest.raises(ConfigError, match="it ends before byte 6015 that the line index expects; read stopped at byte 100"):
        length_pass._length_range(ds, 0, 300, True)
    with pytest.raises(ConfigError, match="it ends before byte 986 .* read stopped at byte 940"):
        ds.index.line(20)


def test_file_appended_to_during_the_pass_is_an_error(tmp_path, monkeypatch):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    ds = JsonlSFTDataset(path, TOK, max_length=16, length_workers=1)
    real = length_pass._length_range

    def appending(*args):
        with open(path, "ab") as f:
            f.write(json.dumps(GOOD).encode() + b"\n")
        return real(*args)

    monkeypatch.setattr(length_pass, "_length_range", appending)
    with pytest.raises(ConfigError, match=r"changed during the length pass \(size, mtime_ns, inode \(14100, .* before it, \(14147, "):
        ds.lengths
    assert not list(tmp_path.glob("*.len-*"))  # nothing cached from a changed file


class KillingIndex(LineIndex):
    """A line index whose read of byte ``kill_at`` SIGKILLs the process, outside the test process."""

    def read(self, lo, hi):
        if os.getpid() != self.parent and lo <= self.kill_at < hi:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().read(lo, hi)


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh_interpreters"])
def test_a_worker_killed_mid_pass_is_an_error_naming_its_lines_not_a_hang(tmp_path, monkeypatch, fresh):
    path = write(tmp_path / "d.jsonl", [GOOD] * 300)
    ds = JsonlSFTDataset(path, TOK, max_length=16)
    ds.index.__class__ = KillingIndex
    ds.index.parent, ds.index.kill_at = os.getpid(), 160 * 47  # line 161: in the range of lines 151-187
    monkeypatch.setattr(length_pass, "FRESH_WORKERS_MIN_BYTES", 0 if fresh else 1 << 60)
    if fresh and not length_pass._glibc():
        pytest.skip("fresh-interpreter workers are used on glibc only")
    if fresh:  # the fresh interpreters themselves must report the death, not a fork fallback
        monkeypatch.setattr(length_pass, "_forked_worker_results", lambda *a: pytest.fail("fell back to fork"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^length_workers: the length-pass worker for lines 151-187 died "
                                          r"\(killed by SIGKILL \(the OOM killer sends it\)\)\. Fix: give the pass"):
        ds.compute_lengths(workers=2)
    assert time.monotonic() - started < 30
    ds.index.kill_at = -1  # the same dataset then computes normally: no worker is left behind
    assert ds.compute_lengths(workers=2)[0].tolist() == [7] * 300
