"""energon_pack.video: header probe and chosen-frame decoding (seeking) against a full decode."""

import av
import numpy as np
import pytest

from _video_files import video_bytes
from energon_pack.errors import SampleSkipped
from energon_pack.video import decode as video_decode
from energon_pack.video import decode_frames, probe_video


def _all_frames(data: bytes) -> list[np.ndarray]:
    import io

    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]


@pytest.mark.parametrize("ext,gop", [("mp4", 4), ("mp4", None), ("webm", 5), ("mkv", 3), ("mov", 6)])
def test_seeking_decode_equals_full_decode(tmp_path, ext, gop):
    """Chosen frames (sparse, dense, repeated, first and last) are byte-equal to the same frames of
    a decode of every frame; the header's frame count is the decoded one."""
    data = video_bytes(61, 25, 64, 48, tmp_path, ext=ext, gop=gop)
    full = _all_frames(data)
    assert probe_video(data).num_frames == len(full) == 61
    for indices in ([0, 60], [3, 4, 5, 30, 31, 59], [10, 10, 40], list(range(0, 61, 12)), [60]):
        got = [np.asarray(img) for img in decode_frames(data, indices)]
        assert len(got) == len(indices)
        for i, frame in zip(indices, got):
            assert np.array_equal(frame, full[i]), (ext, gop, indices, i)


def test_sparse_samples_seek_past_unneeded_gops(tmp_path, monkeypatch):
    """With a keyframe every 4 frames, two frames 100 apart decode a handful of frames, not 100."""
    data = video_bytes(121, 30, 32, 32, tmp_path, gop=4)
    seeks = []
    real_seek = av.container.InputContainer.seek

    def seek(self, offset, **kw):
        seeks.append(offset)
        return real_seek(self, offset, **kw)

    monkeypatch.setattr(av.container.InputContainer, "seek", seek)
    assert len(list(decode_frames(data, [2, 110]))) == 2
    assert len(seeks) == 2  # one seek per sampled frame: to the keyframe before it


def test_corrupt_and_truncated_videos_are_skips_with_a_reason(tmp_path):
    data = video_bytes(20, 10, 32, 32, tmp_path)
    for bad in (b"", b"garbage" * 100, data[: len(data) // 2], b"\x1aE\xdf\xa3" + b"\x00" * 64):
        with pytest.raises(SampleSkipped) as skip:
            probe_video(bad)
        assert skip.value.reason == "corrupt_video"
    with pytest.raises(SampleSkipped) as skip:
        list(decode_frames(data, [0, 25]))  # past the end
    assert skip.value.reason == "corrupt_video"
    with pytest.raises(ValueError):
        list(decode_frames(data, [5, 2]))


def test_streams_without_packet_timestamps_decode_from_the_start(tmp_path, monkeypatch):
    data = video_bytes(15, 10, 32, 32, tmp_path, ext="mkv")
    monkeypatch.setattr(video_decode, "packet_timeline", lambda _data: None)
    got = [np.asarray(img) for img in decode_frames(data, [1, 7, 14])]
    full = _all_frames(data)
    assert all(np.array_equal(g, full[i]) for g, i in zip(got, [1, 7, 14]))


def test_encode_chat_takes_a_video_file(tmp_path):
    """The functional API: a video file's bytes are planned from the header and only its sampled
    frames decoded; the grid, token count and pixel rows agree with the plan."""
    from energon_pack.qwen_vl import get_preset, load_demo_tokenizer
    from energon_pack.qwen_vl.chat import encode_chat
    from energon_pack.qwen_vl.video import plan_video

    preset = get_preset("qwen2.5-vl", video_min_pixels=4 * 784, video_max_pixels=8 * 784)
    data = video_bytes(33, 12, 64, 48, tmp_path, ext="webm")
    conv = [{"role": "user", "content": "<video>\nwhat moves?"}, {"role": "assistant", "content": "a bar"}]
    enc, media = encode_chat(conv, videos=[data], tokenizer=load_demo_tokenizer(), preset=preset)
    plan = plan_video(probe_video(data), preset)
    t, h, w = plan.grid_thw
    assert enc.video_grid_thw.tolist() == [[t, h, w]] and media.video_grid_thw.tolist() == [[t, h, w]]
    assert enc.video_token_counts == [t * h * w // 4] and media.pixel_values_videos.shape == (t * h * w, 1176)
    assert media.second_per_grid_ts == [2 / plan.sampled_fps] == enc.second_per_grid_ts


def test_frame_and_sample_pixel_caps_are_checked_from_the_header(tmp_path, monkeypatch):
    """A file may declare huge frames (two 16000x16000 PNGs as KEY.0.mp4 decoded at 3.77 GB): refused from the
    header before a frame is decoded, per frame and per sample, with the knob named; raising the knob lets it in."""
    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.video import plan_video
    from energon_pack.video import probe as video_probe

    data = video_bytes(12, 24, 64, 48, tmp_path)
    header = probe_video(data)
    assert video_probe.MAX_FRAME_PIXELS == 7680 * 4320 and video_probe.MAX_SAMPLE_PIXELS == 2**31
    monkeypatch.setattr(video_probe, "MAX_FRAME_PIXELS", 64 * 48 - 1)
    decoded = []
    monkeypatch.setattr(video_decode, "decode_frames", lambda *a, **k: decoded.append(a) or iter(()))
    with pytest.raises(SampleSkipped) as err:
        probe_video(data)
    assert err.value.reason == "video_too_large" and "64x48 frames (3,072 pixels)" in err.value.detail
    assert "energon_pack.video.probe.MAX_FRAME_PIXELS (3,071)" in err.value.detail and not decoded
    monkeypatch.setattr(video_probe, "MAX_FRAME_PIXELS", 64 * 48)
    assert probe_video(data) == header
    plan = plan_video(header, get_preset("qwen2.5-vl"))
    monkeypatch.setattr(video_probe, "MAX_SAMPLE_PIXELS", plan.num_frames * 64 * 48 - 1)
    with pytest.raises(SampleSkipped) as err:
        plan_video(header, get_preset("qwen2.5-vl"))
    assert err.value.reason == "video_too_large" and f"{plan.num_frames} sampled 64x48 frames" in err.value.detail


def test_frames_that_share_timestamps_decode_in_order(tmp_path):
    """An MKV of 30 frames at a declared 1e6 fps: Matroska's millisecond timestamps give most frames the same one,
    and a seek by timestamp returned the wrong frames (max pixel difference 245); they now decode in order."""
    data = video_bytes(30, 1_000_000, 64, 48, tmp_path, ext="mkv")
    pts, _ = video_decode.packet_timeline(data)
    assert len(set(pts)) < len(pts)  # the shared timestamps this test is about
    full = _all_frames(data)
    wanted = [0, 3, 3, 11, 17, 29]
    got = [np.asarray(im) for im in decode_frames(data, wanted)]
    assert all(np.array_equal(g, full[i]) for g, i in zip(got, wanted))


def test_an_image_stored_as_a_video_is_refused_from_its_header(monkeypatch):
    """Two 16000x16000 PNGs as ``KEY.0.mp4``: FFmpeg would decode the first frame (about 740 MB) just to read its
    size; PIL's header read refuses it first, and FFmpeg is never asked."""
    from energon_pack.video import probe as video_probe
    from harness.faults import png_of_zero_rows

    opened = []
    monkeypatch.setattr(video_probe, "open_container", lambda data: opened.append(data))
    png = png_of_zero_rows(16000)
    with pytest.raises(SampleSkipped) as err:
        probe_video(png + png)
    assert err.value.reason == "video_too_large" and not opened  # over PIL's own bomb limit: PIL says why
    assert err.value.detail.startswith("an image stored as a video: Image size (256000000 pixels) exceeds limit")
    with pytest.raises(SampleSkipped) as err:
        probe_video(png_of_zero_rows(9000))  # under PIL's limit, over ours
    assert err.value.reason == "video_too_large" and not opened
    assert "a PNG image of 9000x9000 (81,000,000 pixels) stored as a video exceeds" in err.value.detail
