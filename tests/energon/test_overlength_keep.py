"""``overlength="fit"`` / ``"split"`` through the real Energon loader (2 workers) on shards this module writes: the
samples that are ``oversize`` skips under ``"skip"`` at width 4096 are delivered fitted or split and counted as
adjustments, nothing over the width reaches a pack, fitted images equal HF's processor given the chosen
``max_pixels``, a resume gives the same packs, the policy is in the fingerprint, and text roads refuse both."""

import io
import json
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
from PIL import Image
from test_resume_robust import roundtrip

from _video_files import video_bytes
from energon_pack.energon.fingerprint import ResumeConfigError
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.errors import ConfigError
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl import vision as V
from energon_pack.qwen_vl.chat import ImageMeta
from energon_pack.qwen_vl.overlength import turn_units
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from harness.loaders import batch_difference, close

WIDTH = 4096
PRESET = get_preset("qwen2.5-vl")
WORDS = " ".join(f"w{i % 50}" for i in range(300))  # ~600 demo tokens


def _jpeg(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([(xx * 3 + seed) % 256, (yy * 5) % 256, rng.integers(0, 256, (height, width))], -1)
    buf = io.BytesIO()
    Image.fromarray(rgb.astype(np.uint8)).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def _turns(n: int, image_turns=()) -> list:
    out = []
    for t in range(n):
        user = [{"type": "text", "text": f"Question {t}: {WORDS}"}]
        if t in image_turns:
            user.insert(0, {"type": "image"})
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": f"Answer {t}: {WORDS}"}]
    return out


#: key -> what it is; "big": 2 images of 1600x1400 (5,700 visual tokens), "long": 5 turns (~6,000 tokens) with
#: images in turns 1 and 3, "text": one turn of ~6,000 text tokens, "video": 64 frames of 448x448 (8,192 tokens)
KINDS = {**{f"{i:04d}": "short" for i in range(12)}, "0012": "big", "0013": "big", "0014": "long"}
KINDS.update({"0015": "long", "0016": "text", "0017": "video"})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overlength_shards")
    scratch = tmp_path_factory.mktemp("overlength_src")
    with wds.ShardWriter(str(folder / "ol-%06d.tar"), maxcount=9, verbose=0) as sink:
        for i, (key, kind) in enumerate(KINDS.items()):
            sample = {"__key__": key}
            if kind == "short":
                conv = [{"role": "user", "content": f"<image>Describe {i}."}, {"role": "assistant", "content": "A."}]
                sample["0.jpg"] = _jpeg(64 + 8 * i, 48, i)
            elif kind == "big":
                conv = _turns(1)
                conv[0]["content"] = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]
                sample.update({"0.jpg": _jpeg(1600, 1400, i), "1.jpg": _jpeg(1400, 1600, i + 1)})
            elif kind == "long":
                conv = [{"role": "system", "content": "You are terse."}] + _turns(5, image_turns=(1, 3))
                sample.update({"0.jpg": _jpeg(200, 120, i), "1.jpg": _jpeg(96, 160, i)})
            elif kind == "text":
                conv = [{"role": "user", "content": WORDS * 10}, {"role": "assistant", "content": "ok"}]
            else:
                conv = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "Bars."}]
                sample["0.mp4"] = video_bytes(64, 2, 448, 448, scratch)
            sample["json"] = json.dumps(conv).encode()
            sink.write(sample)
    prepare_webdataset(folder)
    return folder


def encoder(policy: str, **kw) -> QwenVLPackingTaskEncoder:
    return QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=WIDTH, overlength=policy, **kw)


def loader(path, policy, repeat=False, **kw):
    ds = get_train_dataset(
        str(path),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        task_encoder=encoder(policy, **kw),
        packing_buffer_size=8,
        repeat=repeat,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def _run(path, policy):
    tracker, batches = PackingStatsTracker(), []
    for batch in loader(path, policy):
        tracker.update(batch["packing_stats"])
        batches.append(batch)
    return batches, tracker.total


@pytest.fixture(scope="module")
def runs(shards):
    return {policy: _run(shards, policy) for policy in ("skip", "fit", "split")}


def _keys(batches):
    return Counter(k for b in batches for k in b["__keys__"])


def _within_width(batches):
    for b in batches:
        assert b["input_ids"].shape[1] <= WIDTH and int(b["cu_seqlens_q"][-1]) <= WIDTH
        assert all(int(n) <= WIDTH for n in torch.diff(b["cu_seqlens_q"]))


def test_skip_drops_the_over_long_samples(runs):
    batches, stats = runs["skip"]
    assert stats.skips == Counter(oversize=6)
    assert sorted(_keys(batches)) == sorted(k for k, kind in KINDS.items() if kind == "short")
    assert not stats.adjustments


def test_fit_delivers_the_media_samples_fitted(runs):
    batches, stats = runs["fit"]
    _within_width(batches)
    assert _keys(batches) == Counter(k for k, kind in KINDS.items() if kind in ("short", "big", "video"))
    assert stats.skips == Counter(oversize_text=3)  # "long" and "text": their text alone is over the width
    assert stats.adjustments["fitted"] == 3
    assert stats.adjustments["fit_pixels_after"] < stats.adjustments["fit_pixels_before"]
    assert "split" not in stats.adjustments


def test_split_delivers_pieces_and_trains_every_supervised_token_once(runs):
    batches, stats = runs["split"]
    _within_width(batches)
    keys = _keys(batches)
    assert all(n == 1 for n in keys.values())
    assert stats.skips == Counter(oversize_text=1)
    assert stats.adjustments["fitted"] == 3  # the two "big" and the video: one turn each, fitted
    assert stats.adjustments["split"] == 2
    pieces = sorted(k for k in keys if "#" in k)
    assert stats.adjustments["split_pieces"] == len(pieces) >= 4
    assert {k.split("#")[0] for k in pieces} == {"0014", "0015"}
    # the pieces supervise exactly the answers of the whole conversation: 5 answers, each once
    tok = encoder("split").tokenizer
    trained = []
    for b in batches:
        labels = b["labels"][0]
        for s, e, key in zip(b["cu_seqlens_q"][:-1], b["cu_seqlens_q"][1:], b["__keys__"]):
            if key.startswith("0014#"):
                supervised = labels[s:e][labels[s:e] != -100]
                trained.append(tok.decode(supervised.tolist()))
    answers = [t for text in trained for t in text.split("<|im_end|>") if t.startswith("Answer")]
    assert sorted(a.split(":")[0] for a in answers) == [f"Answer {t}" for t in range(5)]
    system = sum(int((b["input_ids"][0] == tok.encode("You are terse.")[0]).sum()) for b in batches)
    assert system >= len([k for k in pieces if k.startswith("0014#")])  # the system prompt repeated in each piece


def test_fitted_images_equal_hf_processor_for_each_preset(shards):
    """For each preset: the fitted caps of the "big" sample, our pixels under them, and HF's processor given
    ``size={"longest_edge": cap, "shortest_edge": min_pixels}``: the same grid and the same pixel values."""
    from transformers import Qwen2VLImageProcessor

    sizes = [(800, 700), (700, 800), (640, 480)]
    images = [_jpeg(w, h, i) for i, (w, h) in enumerate(sizes)]
    conv = _turns(1)
    conv[0]["content"] = [{"type": "image"}] * 3 + [{"type": "text", "text": "Compare."}]
    for name in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl"):
        preset = get_preset(name)
        te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=preset, seq_length=2048, overlength="fit")
        whole = te._measured(conv, images, [], [ImageMeta(w, h) for w, h in sizes], [])
        parsed = te._fitted(whole)
        assert not te._fits(whole["cost"]) and te._fits(parsed["cost"]) and parsed["adjustment"]["fitted"] == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for data, meta in zip(images, parsed["image_metas"]):
                assert meta.max_pixels is not None and meta.max_pixels % preset.factor**2 == 0
                proc = Qwen2VLImageProcessor(
                    patch_size=preset.patch_size,
                    merge_size=preset.merge_size,
                    temporal_patch_size=preset.temporal_patch_size,
                    size={"longest_edge": meta.max_pixels, "shortest_edge": preset.min_pixels},
                    image_mean=list(preset.image_mean),
                    image_std=list(preset.image_std),
                )
                ref = proc(images=[Image.open(io.BytesIO(data))], return_tensors="np")
                rows, grid = V.pending_image(data, preset, meta.max_pixels)
                np.testing.assert_array_equal(grid, ref["image_grid_thw"], err_msg=name)
                assert tuple(grid[0]) == meta.grid(preset)
                np.testing.assert_allclose(rows.to_tensor().numpy(), ref["pixel_values"], atol=1e-5, rtol=1e-5)


def test_resume_gives_the_same_packs_and_the_policy_is_in_the_fingerprint(shards):
    for policy in ("fit", "split"):
        reference = loader(shards, policy, repeat=True)
        it = iter(reference)
        [next(it) for _ in range(3)]
        state = roundtrip(reference.save_state_rank())
        expected = [next(it) for _ in range(4)]
        close(reference)
        restored = loader(shards, policy, repeat=True)
        restored.restore_state_rank(state)
        it = iter(restored)
        got = [next(it) for _ in range(4)]
        close(restored)
        assert [b["__keys__"] for b in got] == [b["__keys__"] for b in expected]
        assert all(batch_difference(a, b) is None for a, b in zip(got, expected))
        assert got[-1]["packing_stats"]["adjustments"] == expected[-1]["packing_stats"]["adjustments"]
    other = loader(shards, "skip", repeat=True)
    with pytest.raises(ResumeConfigError, match="overlength"):
        other.restore_state_rank(state)


def test_text_roads_refuse_fit_and_split(tmp_path):
    from energon_pack.energon.text import TextPackingTaskEncoder
    from energon_pack.sft.dataset import JsonlSFTDataset

    for policy in ("fit", "split"):
        with pytest.raises(ConfigError, match=r"overlength.*Qwen-VL policy") as err:
            TextPackingTaskEncoder(tokenizer="demo", seq_length=256, overlength=policy)
        assert err.value.knob == "overlength" and "'truncate'" in str(err.value)
        path = tmp_path / "d.jsonl"
        path.write_text('{"prompt": "a", "completion": "b"}\n')
        with pytest.raises(ConfigError, match="overlength"):
            JsonlSFTDataset(path, "demo", "prompt_completion", max_length=64, overlength=policy)


def test_turn_units_keep_user_runs_and_trailing_questions_together():
    from energon_pack.chat.conversation import Message

    def m(role):
        return Message(role, (("text", role),))

    head, units = turn_units([m("system"), m("user"), m("user"), m("assistant"), m("user"), m("assistant"), m("user")])
    assert [x.role for x in head] == ["system"]
    assert [[x.role for x in u] for u in units] == [["user", "user", "assistant"], ["user", "assistant", "user"]]


def test_a_long_video_gets_smaller_frames_then_fewer(tmp_path):
    """A 100-frame clip of 64x48 (50 s at 2 fps: 50 temporal steps of 140 tokens, upscaled to the per-frame minimum
    already) fits 4096
    only with fewer frames: the fitted plan is qwen-vl-utils' plan under a lower ``max_frames`` and the smallest
    per-frame budget, and its tokens fit."""
    from energon_pack.qwen_vl.video import VideoFile, plan_video
    from energon_pack.video import FrameSampling, probe_video

    data = video_bytes(100, 2, 64, 48, tmp_path)
    te = encoder("fit")
    meta = te._video_meta(data)
    assert meta.plan.num_frames == 100
    conv = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "Bars."}]
    whole = te._measured(conv, [], [VideoFile(data, meta.plan)], [], [meta])
    fitted = te._fitted(whole)
    plan = fitted["video_metas"][0].plan
    assert not te._fits(whole["cost"]) and te._fits(fitted["cost"])
    assert 2 <= plan.num_frames < 100 and plan.num_frames % 2 == 0
    reference = plan_video(probe_video(data), PRESET, FrameSampling(max_frames=plan.num_frames, max_video_tokens=1))
    assert plan == reference and fitted["videos"][0].plan == plan
    assert fitted["adjustment"]["fit_pixels_after"] < fitted["adjustment"]["fit_pixels_before"]
    # the most frames that fit: two more would not
    more = plan_video(probe_video(data), PRESET, FrameSampling(max_frames=plan.num_frames + 2, max_video_tokens=1))
    assert not te._fits(te._measured(conv, [], [VideoFile(data, more)], [], [type(meta).from_plan(more)])["cost"])


def test_rounds_mode_counts_the_same_adjustments(shards, runs):
    """Energon's own PackingDataset road (``packing_mode="rounds"``) delivers the same samples and pieces and counts
    the same adjustments as carry mode."""
    tracker, keys = PackingStatsTracker(), Counter()
    for batch in loader(shards, "split", packing_mode="rounds"):
        tracker.update(batch["packing_stats"])
        keys.update(batch["__keys__"])
        _within_width([batch])
    assert keys == _keys(runs["split"][0])
    assert tracker.total.adjustments == runs["split"][1].adjustments
    assert tracker.total.skips == runs["split"][1].skips


def test_a_frame_list_video_is_fitted_with_its_own_video_max_pixels():
    """A video stored as 8 frames of 640x480 (1,568 visual tokens) in a 1024 pack: fitted with its own
    ``video_max_pixels``; post-encode decodes the frames to exactly the fitted grid (no size mismatch)."""
    from energon_pack.energon.samples import PackCandidate

    frames = [_jpeg(640, 480, i) for i in range(8)]
    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=1024, overlength="fit")
    meta = te._video_meta(frames)
    conv = [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": "Bars."}]
    whole = te._measured(conv, [], [frames], [], [meta])
    fitted = te._fitted(whole)
    cap = fitted["video_metas"][0].max_pixels
    assert not te._fits(whole["cost"]) and te._fits(fitted["cost"])
    assert cap % PRESET.factor**2 == 0 and PRESET.video_min_pixels <= cap < PRESET.video_max_pixels
    candidate = PackCandidate(__key__="v", __restore_key__=(), cost=fitted["cost"], payload=fitted)
    segment = te._postencode(candidate).segment
    grid = V.video_grid_thw(8, 480, 640, V.with_max_pixels(PRESET, cap, video=True))
    assert segment.visual["video_grid_thw"].tolist() == [list(grid)]
    assert len(segment.input_ids) == fitted["length"] <= 1024
    assert segment.visual["pixel_values_videos"].shape[0] == grid[0] * grid[1] * grid[2]
