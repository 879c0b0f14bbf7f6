"""``energon-pack convert`` on good records mixed with hostile ones (paths, encodings, sizes, special files),
as JSONL, as a JSON array, and devices with --allow-outside-paths, then the real loader over each output:
no traceback or hang, every hostile record a counted skip under its reason (in convert or in the loader),
every good one written and delivered once, no byte from outside the allowed roots in the shards.
Bounded: each hostile kind once; full: 50 times, with 1,000 good records."""

import json

import pytest

from harness.convert_fuzz import run_convert_fuzz

ZERO = (
    "crashes",
    "hangs",
    "skip_reason_mismatches",
    "written_unwanted",
    "wanted_not_written",
    "written_twice",
    "outside_bytes_in_shards",
    "delivered_twice",
    "delivered_unwritten",
    "delivered_unwanted",
    "wanted_not_delivered",
    "written_unaccounted",
    "loader_reason_mismatches",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory, stress_scale):
    return run_convert_fuzz(tmp_path_factory.mktemp("convert_fuzz"), stress_scale)


@pytest.mark.stress
def test_convert_fuzz_counts_every_hostile_record_and_reads_nothing_outside(report):
    json.dumps(report)  # plain data for the report command
    assert {k: report[k] for k in ZERO} == dict.fromkeys(ZERO, 0), report["errors"]
    assert report["records_add_up"] and set(report["containers"]) == {
        "jsonl",
        "json array",
        "devices, --allow-outside-paths",
    }
    assert report["convert_skips"] == report["convert_skips_wanted"]
    assert report["loader_skips"] == report["loader_skips_wanted"]
    assert report["written"] == report["delivered"] + sum(report["loader_skips"].values())
    reasons = set(report["by_case"].values())
    assert reasons >= {
        "path_outside_root",
        "not_a_regular_file",
        "media_too_large",
        "not_an_image",
        "invalid_utf8",
        "invalid_json",
        "invalid_text",
        "bad_image_ref",
        "missing_image",
        "unreadable_image",
    }
    assert "unexpected_error" not in report["convert_skips"]
    assert report["containers"]["devices, --allow-outside-paths"]["outside_control_seen"]  # the byte check works


@pytest.mark.stress
def test_a_hostile_first_line_is_one_counted_skip(report):
    """Each line-level hostile record as a JSONL file's first line: one skip, the next line written."""
    assert report["first_line_failures"] == 0, report["first_line"]
