"""Video file members through the real Energon loader (2 worker processes) and the Qwen-VL encoder:
costs come from container headers, frames are decoded only for samples the packer selected, each
selected video once and only its sampled frames; corrupt videos are counted skips with a reason.

Decodes, header probes and pack selections are logged to one append-only file from every worker
(the loader forks its workers, so the patches made here run in them)."""

import hashlib
import io
import json
import os
from collections import Counter

import pytest
import torch
import webdataset as wds
from megatron.energon import WorkerConfig, get_loader, get_train_dataset

from _video_files import video_bytes
from energon_pack.energon import carry_over
from energon_pack.energon.prepare import prepare_webdataset
from energon_pack.packing import PackingStatsTracker
from energon_pack.qwen_vl import get_preset
from energon_pack.qwen_vl import task_encoder as qwen_task_encoder
from energon_pack.qwen_vl.task_encoder import QwenVLPackingTaskEncoder
from energon_pack.qwen_vl.video import plan_video
from energon_pack.video import decode as video_decode
from energon_pack.video import probe_video

F2 = 28 * 28
#: small frames keep pixel work small: 4-8 merged tokens per frame
PRESET = get_preset("qwen2-vl", video_min_pixels=4 * F2, video_max_pixels=8 * F2)
VIDEO_SPECS = [
    (n, fps, w, h, ext)
    for n, fps, w, h, ext in [
        (9, 10, 64, 48, "mp4"),
        (30, 24, 40, 32, "webm"),
        (47, 25, 90, 56, "mkv"),
        (20, 5, 32, 64, "mov"),
        (64, 30, 56, 40, "mp4"),
        (13, 8, 100, 32, "mp4"),
        (90, 15, 48, 48, "webm"),
        (5, 2, 16, 16, "mp4"),
    ]
]
N_SAMPLES = 32


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@pytest.fixture(scope="module")
def video_shards(tmp_path_factory):
    """32 samples in 2 shards: 27 with a video member (``KEY.0.mp4`` / ``.webm`` / ...), each its own
    file; 2 corrupt videos (garbage, a truncated mp4), 1 one-frame video, 2 with an image. Returns
    (root, kind of each key)."""
    folder = tmp_path_factory.mktemp("video_shards")
    scratch = tmp_path_factory.mktemp("video_src")
    good_mp4 = video_bytes(*VIDEO_SPECS[0][:4], scratch)
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, format="PNG")
    kinds = {}
    with wds.ShardWriter(str(folder / "video-%06d.tar"), maxcount=16, verbose=0) as sink:
        for i in range(N_SAMPLES):
            key = f"{i:07d}"
            sample = {"__key__": key}
            if i == 7:
                media, kind = {"0.mp4": b"\x00\x00\x00\x18ftypmp42 not a video at all" * 20}, "corrupt"
            elif i == 15:
                media, kind = {"0.mp4": good_mp4[: len(good_mp4) // 2]}, "corrupt"
            elif i == 23:
                media, kind = {"0.mp4": video_bytes(1, 24, 32, 32, scratch)}, "one_frame"
            elif i in (3, 19):
                media, kind = {"0.png": buf.getvalue()}, "image"
            else:
                n, fps, w, h, ext = VIDEO_SPECS[i % len(VIDEO_SPECS)]  # every sample its own file
                media, kind = {f"0.{ext}": video_bytes(n + i, fps, w, h, scratch, ext=ext)}, "video"
            part = {"type": "video"} if kind != "image" else {"type": "image"}
            conversation = [
                {"role": "user", "content": [part, {"type": "text", "text": f"What is in clip {i}?"}]},
                {"role": "assistant", "content": f"Clip {i} shows moving bars." + " More." * (i % 5)},
            ]
            sample["json"] = json.dumps(conversation).encode()
            sample.update(media)
            sink.write(sample)
            kinds[key] = kind
    prepare_webdataset(folder)
    return folder, kinds


def _logged(path):
    def log(line: str) -> None:
        with open(path, "a") as f:  # one short line per write: appends from several processes do not interleave
            f.write(f"{os.getpid()} {line}\n")

    return log


def test_frames_decoded_only_after_selection(video_shards, tmp_path, monkeypatch):
    root, kinds = video_shards
    log = _logged(tmp_path / "events.log")
    real_decode, real_probe, real_encode = (
        video_decode.decode_frames,
        qwen_task_encoder.probe_video,
        carry_over.CarryOverPackingDataset._encode_members,
    )

    def decode_frames(data, indices):
        log(f"decode {_digest(data)} {len(indices)}")
        return real_decode(data, indices)

    def probe(data):
        log(f"probe {_digest(data)}")
        return real_probe(data)

    def encode_members(self, members):
        log("select " + ",".join(m.__key__ for m in members))
        return real_encode(self, members)

    monkeypatch.setattr(video_decode, "decode_frames", decode_frames)
    monkeypatch.setattr(qwen_task_encoder, "probe_video", probe)
    monkeypatch.setattr(carry_over.CarryOverPackingDataset, "_encode_members", encode_members)

    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=1024)
    ds = get_train_dataset(
        root,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        task_encoder=te,
        packing_buffer_size=12,
        repeat=False,
    )
    batches = list(get_loader(ds))

    # every valid sample exactly once; each corrupt / too short video a counted skip
    emitted = [k for b in batches for k in b["__key__"].split(",")]
    assert sorted(emitted) == sorted(k for k, kind in kinds.items() if kind in ("video", "image"))
    tracker = PackingStatsTracker()
    for b in batches:
        tracker.update(b["packing_stats"])
    assert dict(tracker.total.skips) == {"corrupt_video": 2, "video_too_few_frames": 1}

    # the grids in the batches are the header plans: only the sampled frames, decoded once per selected sample
    video_of = {key: data for key, data in _video_members(root).items()}
    plans = {key: plan_video(probe_video(data), PRESET) for key, data in video_of.items() if kinds[key] == "video"}
    for b in batches:
        keys = [k for k in b["__key__"].split(",") if kinds[k] == "video"]
        want = torch.tensor([plans[k].grid_thw for k in keys], dtype=torch.int64).reshape(-1, 3)
        assert torch.equal(b.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.int64)), want)

    key_of = {_digest(data): key for key, data in video_of.items()}
    events = [line.split(" ") for line in (tmp_path / "events.log").read_text().splitlines()]
    assert len({e[0] for e in events}) == 2  # both worker processes ran (and logged)
    probes = Counter(key_of[e[2]] for e in events if e[1] == "probe")
    assert probes == Counter(k for k, kind in kinds.items() if kind != "image")  # every video's header, once
    decodes = [(e[0], key_of[e[2]], int(e[3])) for e in events if e[1] == "decode"]
    assert sorted(k for _, k, _ in decodes) == sorted(plans)  # each selected video decoded exactly once
    assert all(n == plans[k].num_frames for _, k, n in decodes)  # only its sampled frames
    assert sum(n for _, _, n in decodes) < sum(plans[k].total_frames for k in plans)
    selected: dict[str, set] = {}
    waiting: dict[str, set] = {}  # per worker: headers read, not selected yet, when its first frame was decoded
    probed: dict[str, set] = {}
    for pid, kind, *rest in events:
        if kind == "select":
            selected.setdefault(pid, set()).update(rest[0].split(","))
        elif kind == "probe":
            probed.setdefault(pid, set()).add(key_of[rest[0]])
        elif kind == "decode":
            # no frame of a sample is decoded before the packer selected it (in the same worker)
            assert key_of[rest[0]] in selected.get(pid, set()), (pid, key_of[rest[0]])
            waiting.setdefault(pid, probed[pid] - selected[pid])
    # the buffer held costed, undecoded samples while the first pack was decoded (in both workers)
    assert len(waiting) == 2 and all(waiting.values()), waiting


def _video_members(root) -> dict:
    """key -> bytes of its video member, read back from the shards."""
    import tarfile

    out = {}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if ext.split(".")[-1] in ("mp4", "webm", "mkv", "mov"):
                    out[key] = tar.extractfile(member).read()
    return out


def _savable(root, sampling):
    from megatron.energon import get_savable_loader

    te = QwenVLPackingTaskEncoder(tokenizer="demo", preset=PRESET, seq_length=1024, video_sampling=sampling)
    ds = get_train_dataset(
        root,
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=te,
        packing_buffer_size=6,
        repeat=False,
    )
    return get_savable_loader(ds, checkpoint_every_min_n_samples=1, checkpoint_every_sec=0)


def test_video_sampling_is_part_of_the_resume_fingerprint(video_shards):
    """A state saved with one frame sampling resumes exactly with the same one and is refused, naming
    ``video_sampling``, with another (costs, hence packs, would differ)."""
    from energon_pack.energon.checkpoint import restore_state_rank
    from energon_pack.energon.fingerprint import ResumeConfigError
    from energon_pack.video import FrameSampling

    root, _ = video_shards
    first = _savable(root, FrameSampling())
    it = iter(first)
    next(it)
    state = first.save_state_rank()
    rest = [b["__key__"] for b in it]
    again = _savable(root, FrameSampling())
    restore_state_rank(again, state)
    assert [b["__key__"] for b in again] == rest and rest
    other = _savable(root, FrameSampling(fps=1.0))
    with pytest.raises(ResumeConfigError) as err:
        restore_state_rank(other, state)
    assert err.value.knob == "video_sampling"
