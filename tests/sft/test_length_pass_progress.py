"""``length_pass.progress`` (inspect's progress bar): a serial pass then runs in line ranges,
with the same result as one range, and reports every line once."""

import json

import numpy as np

from energon_pack.chat.tokenizer import load_demo_tokenizer
from energon_pack.sft import length_pass
from energon_pack.sft.dataset import JsonlSFTDataset


def test_progress_reports_every_line_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(length_pass, "RANGE_LINES", 64)
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"q {i}", "completion": "a " * (i % 9)} if i % 7 else "{broken" for i in range(300)]
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    tok = load_demo_tokenizer()
    plain = JsonlSFTDataset(path, tok, length_workers=1, cache_dir=tmp_path / "a").compute_lengths()
    ticks = []
    with length_pass.progress(ticks.append):
        ranged = JsonlSFTDataset(path, tok, length_workers=1, cache_dir=tmp_path / "b").compute_lengths()
    assert ticks[0] == 0 and len(ticks) > 2 and sum(ticks) == 300
    assert np.array_equal(plain[0], ranged[0]) and plain[1:3] == ranged[1:3]
