"""A state restored into another rank, world size, worker count or dataset, or edited, is a ConfigError
naming the change (workers {0, 2} x world sizes {1, 2, 3} x carry/rounds when full); the unchanged
loader resumes with exactly the remaining packs."""

import pytest

from harness.topology import run_topology


@pytest.mark.stress
def test_restore_elsewhere_is_refused_naming_the_change(tmp_path, stress_scale):
    result = run_topology(tmp_path, stress_scale)
    assert {k: result[k] for k in ("accepted_silently", "wrong_error", "hangs", "control_mismatches")} == dict(
        accepted_silently=0, wrong_error=0, hangs=0, control_mismatches=0
    ), result["failures"]
    assert result["refused_correctly"] == result["cases"] >= (400 if stress_scale == "full" else 25)
    assert result["controls"] >= (48 if stress_scale == "full" else 3)
    changes = {
        "other_rank",
        "world_size",
        "other_workers",
        "shard_added",
        "shard_removed",
        "shard_resized",
        "open_bins_removed",
        "packing_counter_edited",
        "reader_position_edited",
    }
    assert {c for c, outcomes in result["by_change"].items() if outcomes.get("refused_correctly")} == changes
    assert (tmp_path / "resume_topology.json").is_file()
