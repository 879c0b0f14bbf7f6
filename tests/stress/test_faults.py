"""Faults of video files, object storage and ``pack-offline`` (:mod:`harness.faults`), each case with the outcome
it must have: hostile video files (two 16000x16000 PNGs as ``KEY.0.mp4``, 8192x8192 frames, 30 frames sharing
millisecond timestamps) through the real loader next to good samples; a stalled shard in object storage with
bounded waits, and the same prefix read normally; two pack-offline runs racing into one folder, and runs SIGKILLed
at seeded points. Bounded: 2 races, 4 kill points; full: 10 races, 30 kill points and a VP9 8K video."""

import json

import pytest

from harness.faults import FIGURES, KILL_SPAN, RSS_BOUND_MB, run_faults


@pytest.fixture(scope="module")
def report(tmp_path_factory, stress_scale):
    return run_faults(tmp_path_factory.mktemp("faults"), stress_scale)


@pytest.mark.stress
def test_every_fault_case_has_its_expected_outcome(report):
    json.dumps(report)  # plain data for the report command
    assert {k: report[k] for k in FIGURES} == dict.fromkeys(FIGURES, 0), report["missed"]
    assert report["cases"] == len(report["outcomes"]) and report["cases"] >= 40


@pytest.mark.stress
def test_hostile_videos_are_header_skips_and_the_dense_mkv_is_delivered(report):
    assert report["video_skips"] == {"video_too_large": 2 + (report["scale"] == "full")}
    assert report["video_workers_seen"] == 2 and 0 < report["video_peak_worker_uss_mb"] <= RSS_BOUND_MB
    assert report["video_planned_frames"] == [0, 10, 19, 29]  # 30 frames at 1e6 fps: 4 sampled, in order


@pytest.mark.stress
def test_the_stalled_read_and_the_kill_points_ran(report):
    assert 1 <= report["stalled_read_seconds"] and report["store_keys"] == 60
    kills = report["kills"]
    assert len(kills) == (4 if report["scale"] == "bounded" else 30)
    assert all(0 < k["delay"] < KILL_SPAN * report["pack_run_seconds"] for k in kills)
    assert set(report["kill_states"]) <= {"old", "new"}
