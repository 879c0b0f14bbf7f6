"""Per-source counters of PackingStats: shares, fill contribution and skips per source, merged across workers,
through a state dict, and read from states saved before sources were counted; the bench's per-source table."""

from collections import Counter

from energon_pack.bench.loader_bench import CellResult, cell_sources, format_sources, merge_runs
from energon_pack.packing import PackingStats, PackingStatsTracker


def _worker(rank, worker, photos, text):
    stats = PackingStats()
    stats.record_pack([(photos,), (text,)], (1000,))
    stats.record_source("photos", {"samples": 1, "real_tokens": photos, "supervised_tokens": 10, "step_cost": 2.0})
    stats.record_source("text", {"samples": 1, "real_tokens": text, "supervised_tokens": 30, "step_cost": 1.0})
    stats.record_source("text", {"skip:invalid_json": 1})
    return {"rank": rank, "worker": worker, **stats.state_dict()}


def test_per_source_numbers_merged_over_workers_and_through_a_state_dict():
    tracker = PackingStatsTracker()
    tracker.update(_worker(0, 0, 300, 500))
    tracker.update(_worker(0, 1, 100, 100))
    total = tracker.total
    assert total.per_source() == {
        "photos": {
            "samples": 2,
            "real_tokens": 400,
            "supervised_tokens": 20,
            "token_share": 0.4,
            "cost_share": round(4 / 6, 6),
            "fill_contribution": 0.2,
            "skips": {},
        },
        "text": {
            "samples": 2,
            "real_tokens": 600,
            "supervised_tokens": 60,
            "token_share": 0.6,
            "cost_share": round(2 / 6, 6),
            "fill_contribution": 0.3,
            "skips": {"invalid_json": 2},
        },
    }
    assert total.summary()["sources"] == total.per_source() and total.fill == 0.5
    assert PackingStats.from_state_dict(total.state_dict()).per_source() == total.per_source()


def test_states_without_sources_load_and_unpriced_packers_have_no_cost_share():
    old = PackingStats().state_dict()
    del old["sources"]
    assert PackingStats.from_state_dict(old).sources == {} and "sources" not in PackingStats().summary()
    stats = PackingStats(slots=100, sources={"a": Counter(samples=1, real_tokens=40)})
    assert stats.per_source()["a"]["cost_share"] is None and stats.per_source()["a"]["fill_contribution"] == 0.4


def test_bench_cells_merge_and_print_their_sources():
    cell = CellResult("carry", 8, 2, 1, 2, 600, 1000, 0.6, 2.0, 1.0, 1.0, 0.1, 10.0)
    a = {**vars(cell), "sources": {"photos": {"samples": 1, "real_tokens": 200, "step_cost": 3.0}}}
    b = {
        **vars(cell),
        "sources": {
            "photos": {"samples": 1, "real_tokens": 100, "step_cost": 1.0},
            "text": {"samples": 2, "real_tokens": 300, "supervised_tokens": 50, "step_cost": 4.0, "skip:oversize": 1},
        },
    }
    merged = merge_runs([CellResult(**a), CellResult(**b)])
    assert merged.sources == {
        "photos": {"real_tokens": 300, "samples": 2, "step_cost": 4.0},
        "text": {"real_tokens": 300, "samples": 2, "skip:oversize": 1, "step_cost": 4.0, "supervised_tokens": 50},
    }
    assert format_sources(cell_sources(merged.slots, merged.sources)).splitlines()[2:] == [
        "photos                  2        300          -     50.0%      50.0%  15.00%  -",
        "text                    2        300         50     50.0%      50.0%  15.00%  oversize=1",
    ]
