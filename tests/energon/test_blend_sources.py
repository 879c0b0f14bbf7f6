"""Metadataset blends (images, videos, text) through the Energon encoders on the real loader with 2 workers, on
shards this module writes: per-source packing stats equal what the packs hold, a blend resumes exactly (packs and
per-source stats), the text encoder blends JSONL files, and the epoch plan equals the packs every rank delivers."""

import io
import json
import warnings
from collections import Counter

import numpy as np
import pytest
import webdataset as wds
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from PIL import Image

from _video_files import video_bytes
from energon_pack.energon import TextPackingTaskEncoder, prepare_jsonl
from energon_pack.energon.blend import check_blend_shares, plan_blend_weights, read_blend, write_blend
from energon_pack.energon.plan import plan_epoch
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference, close, roundtrip

warnings.filterwarnings("ignore", message=".*pin_memory.*")
PRESET = get_preset("qwen2-vl", max_pixels=160 * 28 * 28)
#: folder -> (samples, kind); "chat" also holds one broken-JSON record, "photos" one over-long record
SOURCES = {"photos": (24, "image"), "clips": (6, "video"), "chat": (40, "text")}
#: the name each folder's samples are counted under (clips carries the subflavor source: videos)
NAMES = {"photos": "photos", "clips": "videos", "chat": "chat"}


def _jpeg(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def _words(i: int) -> str:
    return " ".join(f"w{j % 30}" for j in range(5 + 7 * (i % 9)))


def _write(root, name: str, count: int, kind: str) -> None:
    folder = root / name
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%06d.tar"), maxcount=max(1, count // 3), verbose=0) as sink:
        for i in range(count):
            sample = {"__key__": f"{name}{i:04d}"}
            if kind == "image":
                conv = [{"role": "user", "content": f"<image>Describe {_words(i)}"}]
                sample["0.jpg"] = _jpeg(32 + 8 * (i % 7), 48, i)
            elif kind == "video":
                conv = [{"role": "user", "content": "<video>What moves?"}]
                sample["0.mp4"] = video_bytes(4 + 2 * (i % 3), 2, 64, 64, root)
            else:
                conv = [{"role": "user", "content": _words(i) * 3}]
            conv.append({"role": "assistant", "content": _words(i + 1)})
            if kind == "image" and i == 5:
                conv[0]["content"] = "<image>" + "long " * 3000
            sample["json"] = json.dumps(conv).encode()
            if kind == "text" and i == 7:
                sample["json"] = sample["json"][:20]
            sink.write(sample)
    prepare_webdataset(folder)


def _metadataset(root, name: str, entries: str) -> str:
    path = root / name
    path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n{entries}")
    return str(path)


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    for name, (count, kind) in SOURCES.items():
        _write(root, name, count, kind)
    once = "".join(
        f"      - repetitions: 1\n        path: {name}\n"
        + ("        subflavors: {source: videos}\n" * (name == "clips"))
        for name in SOURCES
    )
    weighted = "".join(
        f"      - weight: {w}\n        path: {name}\n" for name, w in (("photos", 2), ("clips", 1), ("chat", 3))
    )
    return {
        "once": _metadataset(root, "once.yaml", "    blend_epochized:\n" + once),
        "weighted": _metadataset(root, "weighted.yaml", "    blend:\n" + weighted),
    }


def encoder(**kw):
    return QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=1024, **kw)


def loader(path, te, *, rank=0, ranks=1, repeat=False, seed=0):
    ds = get_train_dataset(
        path,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=rank, world_size=ranks, num_workers=2, seed_offset=seed),
        task_encoder=te,
        packing_buffer_size=8,
        repeat=repeat,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def measured_by_source(batches) -> dict[str, Counter]:
    """Per source, from the packs themselves: samples, real tokens (segment lengths) and supervised tokens."""
    folder_of = {f"{folder}": NAMES[folder] for folder in SOURCES}
    out: dict[str, Counter] = {}
    for b in batches:
        cu = b["cu_seqlens_q"].tolist()
        for i, key in enumerate(b["__key__"].split(",")):
            source = folder_of[key.rstrip("0123456789")]
            lo, hi = cu[i], cu[i + 1]
            counts = {"samples": 1, "real_tokens": hi - lo, "supervised_tokens": int(b["loss_mask"][0, lo:hi].sum())}
            out.setdefault(source, Counter()).update(counts)
    return out


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_blend_per_source_stats_equal_what_the_packs_hold(blend, mode):
    tracker, batches = PackingStatsTracker(), []
    for b in loader(blend["once"], encoder(packing_mode=mode)):
        tracker.update(b["packing_stats"])
        batches.append(b)
    total = tracker.total
    per_source = total.per_source()
    assert sorted(per_source) == ["chat", "photos", "videos"]
    assert {s: per_source[s]["samples"] for s in per_source} == {"photos": 23, "videos": 6, "chat": 39}
    assert {s: per_source[s]["skips"] for s in per_source} == {
        "photos": {"oversize": 1},
        "videos": {},
        "chat": {"invalid_json": 1},
    }
    measured = measured_by_source(batches)
    for source, counts in measured.items():
        assert {k: total.sources[source][k] for k in counts} == dict(counts), source
    assert sum(c["real_tokens"] for c in total.sources.values()) == total.real_tokens
    assert sum(v["fill_contribution"] for v in per_source.values()) == pytest.approx(total.fill, abs=1e-5)
    if mode == "rounds":  # its first-fit-decreasing prices no step cost
        assert {v["cost_share"] for v in per_source.values()} == {None}
        return
    # carry's default balance="compute": the step cost the packer used, shared out per source
    assert sum(v["cost_share"] for v in per_source.values()) == pytest.approx(1.0, abs=1e-5)
    assert per_source["videos"]["cost_share"] > per_source["videos"]["token_share"]  # vision costs more per token


def test_weighted_blend_resumes_exactly_with_its_per_source_stats(blend):
    cut, more = 5, 6
    first = loader(blend["weighted"], encoder(), repeat=True, seed=4)
    it = iter(first)
    for _ in range(cut):
        next(it)
    state = roundtrip(first.save_state_rank())
    want = [next(it) for _ in range(more)]
    close(first)
    restored = loader(blend["weighted"], encoder(), repeat=True, seed=4)
    restored.restore_state_rank(state)
    it = iter(restored)
    got = [next(it) for _ in range(more)]
    close(restored)
    for a, b in zip(got, want):
        assert batch_difference(a, b) is None, batch_difference(a, b)
    assert [b["packing_stats"]["sources"] for b in got] == [b["packing_stats"]["sources"] for b in want]
    names = {name for b in got for name, _ in b["packing_stats"]["sources"].items()}
    assert names == {"photos", "clips", "chat"}


def test_text_encoder_blends_jsonl_files_per_source(tmp_path):
    for name, count in (("alpaca", 30), ("qa", 12)):
        lines = [json.dumps({"prompt": f"q {_words(i)}", "completion": f"a {_words(i + 2)}"}) for i in range(count)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        assert prepare_jsonl(tmp_path / f"{name}.jsonl") == count
    entries = "".join(f"      - repetitions: 1\n        path: {n}.jsonl\n" for n in ("alpaca", "qa"))
    path = _metadataset(tmp_path, "text.yaml", "    blend_epochized:\n" + entries)
    tracker, supervised = PackingStatsTracker(), 0
    for b in loader(path, TextPackingTaskEncoder(tokenizer="demo", seq_length=512)):
        tracker.update(b["packing_stats"])
        supervised += int(b["loss_mask"].sum())
    per_source = tracker.total.per_source()
    assert {s: v["samples"] for s, v in per_source.items()} == {"alpaca.jsonl": 30, "qa.jsonl": 12}
    assert sum(v["supervised_tokens"] for v in per_source.values()) == supervised


@pytest.fixture(scope="module")
def delivered(blend):
    """Packs each of 2 ranks delivers (2 workers, seed 3), by packing mode: what the plan must equal."""
    return {
        mode: [
            sum(1 for _ in loader(blend["once"], encoder(packing_mode=mode), rank=r, ranks=2, seed=3)) for r in (0, 1)
        ]
        for mode in ("carry", "rounds")
    }


@pytest.mark.parametrize("mode", ["carry", "rounds"])
def test_epoch_plan_equals_the_packs_every_rank_delivers(blend, delivered, mode):
    plan = plan_epoch(blend["once"], encoder(packing_mode=mode), packing_buffer_size=8, ranks=2, workers=2, seed=3)
    assert plan.packs_per_rank == delivered[mode]
    assert plan.steps_per_epoch == max(delivered[mode])
    assert sum(plan.packs_per_worker.values()) == sum(delivered[mode])
    assert plan.stats.samples == 68 and dict(plan.stats.skips) == {"invalid_json": 1, "oversize": 1}
    assert plan.max_steps(epochs=3, accumulation=2) == -(-3 * max(delivered[mode]) // 2)


def test_planned_weights_reach_the_target_token_shares_and_measure_what_the_packs_hold(blend, tmp_path):
    targets = {"photos": 0.5, "videos": 0.3, "chat": 0.2}
    plan = plan_blend_weights(blend["once"], encoder(), targets, samples=100, packing_buffer_size=16)
    # header-only measurement per sample drawn (skips included) == the post-encoded packs' tokens
    packed = measured_by_source(list(loader(blend["once"], encoder())))
    drawn = {"photos": 24, "videos": 6, "chat": 40}
    assert {n: m["drawn"] for n, m in plan.measured.items()} == drawn
    assert {n: m["tokens"] for n, m in plan.measured.items()} == {n: packed[n]["real_tokens"] / drawn[n] for n in drawn}
    raw = {n: targets[n] / plan.measured[n]["tokens"] for n in targets}
    assert plan.weights == pytest.approx({n: raw[n] / sum(raw.values()) for n in raw}, rel=1e-12)
    out = write_blend(blend["once"], plan.weights, tmp_path / "planned.yaml")
    assert [s.name for s in read_blend(out)] == ["photos", "videos", "chat"]
    reached = check_blend_shares(out, encoder(), samples=1500, packing_buffer_size=16).per_source()
    assert {n: abs(reached[n]["token_share"] - t) < 0.02 for n, t in targets.items()} == dict.fromkeys(targets, True)


def test_plan_and_plan_blend_commands(blend, delivered, tmp_path, capsys):
    from energon_pack.cli.main import main

    flags = ["--seq-length", "1024", "--tokenizer", "demo", "--preset", "qwen2-vl", "--buffer", "8"]
    assert main(["plan", blend["once"], "--ranks", "2", "--workers", "2", "--seed", "3", "--epochs", "2", *flags]) == 0
    out = capsys.readouterr().out
    packs = delivered["carry"]  # the command's --seed is also the packer's seed (equal packs here: no tie to break)
    assert f"steps per epoch per rank: {max(packs)} (packs {sum(packs)}, samples 68," in out
    assert f"max_steps for 2 epoch(s), 1 pack(s) per step: {2 * max(packs)}" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith(("chat ", "photos ", "videos "))] == [
        "chat",
        "photos",
        "videos",
    ]
    planned = tmp_path / "planned.yaml"
    shares = "photos=0.5,videos=0.3,chat=0.2"
    args = ["plan-blend", blend["once"], "--target-shares", shares, "--out", str(planned), "--samples", "50"]
    assert main([*args, "--check-samples", "0", *flags]) == 0
    assert abs(sum(s.entry["weight"] for s in read_blend(planned)) - 1) < 1e-5
    assert main([*args[:3], "photos=0.5,chat=0.5", *args[4:], *flags]) == 2
    assert "--target-shares" in capsys.readouterr().err


def test_bench_on_a_metadataset_prints_each_source(blend, tmp_path, capsys):
    from energon_pack.cli.main import main

    args = ["bench", "--data", blend["once"], "--buffers", "8", "--modes", "carry", "--packs", "0", "--no-plots"]
    flags = ["--seq-length", "1024", "--tokenizer", "demo", "--preset", "qwen2-vl", "--out-dir", str(tmp_path)]
    assert main([*args, *flags]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("per source (carry, K=8):") :].splitlines()[3:6]
    assert [(line.split()[0], int(line.split()[1]), line.split()[-1]) for line in lines] == [
        ("chat", 39, "invalid_json=1"),
        ("photos", 23, "oversize=1"),
        ("videos", 6, "-"),
    ]
