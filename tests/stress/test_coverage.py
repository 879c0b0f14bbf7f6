"""Finite epochs on awkward shapes: every valid sample exactly once, every skip counted and visible."""

import pytest

from harness.coverage import run_coverage


@pytest.mark.stress
def test_coverage_has_no_duplicate_loss_or_uncounted_skip(tmp_path, stress_scale):
    result = run_coverage(tmp_path, stress_scale)
    assert {k: result[k] for k in ("duplicates", "lost", "uncounted", "crashes", "hangs")} == dict(
        duplicates=0, lost=0, uncounted=0, crashes=0, hangs=0
    ), result["errors"]
    rows = [r for r in result["results"] if r["shape"] != "empty"]
    assert len(rows) == result["cases"] >= 32
    for row in rows:
        assert (
            row["seen"] == row["valid"]
            and row["seen"] + row["skipped_in_batches"] + row["skipped_in_state_only"] == row["total"]
        ), row
    all_bad = [r for r in rows if r["shape"] == "all_bad"]
    assert all(r["skipped_in_state_only"] == r["total"] == 42 for r in all_bad)
    tail = [r for r in rows if r["shape"] == "post_encode_failures"]
    assert all(r["skipped_in_batches"] == 11 for r in tail)
