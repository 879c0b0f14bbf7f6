"""Save/restore at many cut points (train and finite streams, both modes, 0/2 workers, 1/2 ranks):
every later pack equals the uninterrupted run's, bit for bit."""

import pytest

from harness.resume import run_resume_sweep


@pytest.mark.stress
def test_resume_sweep_has_no_mismatch_duplicate_or_loss(tmp_path, stress_scale):
    result = run_resume_sweep(tmp_path, stress_scale)
    assert result["cut_points"] >= (200 if stress_scale == "full" else 24)
    assert {k: result[k] for k in ("mismatches", "duplicates", "lost", "crashes", "hangs")} == dict(
        mismatches=0, duplicates=0, lost=0, crashes=0, hangs=0
    ), result["errors"]
    assert {c["finite"] for c in result["cells"]} == {True, False}
    assert {c["mode"] for c in result["cells"]} == {"carry", "rounds"}
    assert (tmp_path / "resume_sweep.json").is_file()
