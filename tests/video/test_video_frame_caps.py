"""Frames bounded by what is decoded, not only by what the header says: a Matroska MJPEG file whose header (and
first frame) says 64x64 while a later packet holds a 16000x16000 JPEG (1 MB of zero scan data: a 256-megapixel
frame) peaked at 3.8 GB in the encoder before its ``video_size_mismatch`` skip; the decoder now refuses that frame
before allocating it."""

import io

import av
import numpy as np
import pytest

from _hostile_media import peak_growth_mb, size_changing_mkv
from energon_pack.errors import SampleSkipped
from energon_pack.video import decode_frames, probe_video
from energon_pack.video import probe as video_probe


def _decode_all(path) -> list:
    return [image.size for image in decode_frames(path.read_bytes(), [0, 1])]


def test_a_16000x16000_frame_behind_a_64x64_header_is_refused_before_decoding(tmp_path):
    """In a forked child that only decodes: 3.4 GB more peak memory before (decoded, converted to RGB, then
    refused), now under 100 MB (the refused frame alone would be 256 MB of grey, 768 MB as RGB)."""
    data = size_changing_mkv(tmp_path / "hostile.mkv", (16000, 16000))
    assert len(data) < 1_100_000 and probe_video(data).width == 64  # the header checks see only 64x64
    (reason, detail), grown_mb = peak_growth_mb(_decode_all, tmp_path / "hostile.mkv")
    assert (reason, detail) == (
        "video_size_mismatch",
        "a frame larger than the header's was refused before decoding, the header said 64x64",
    )
    assert grown_mb < 100


def test_a_smaller_frame_of_another_shape_stops_the_decode_at_once(tmp_path):
    """A later 96x32 frame (fewer pixels than the header's 64x64, so the decoder makes it): refused as decoded,
    before the RGB conversion; the first frame came out at the header's size."""
    data = size_changing_mkv(tmp_path / "shape.mkv", (96, 32))
    frames = decode_frames(data, [0, 1])
    assert next(frames).size == (64, 64)
    with pytest.raises(SampleSkipped) as err:
        next(frames)
    assert (err.value.reason, err.value.detail) == (
        "video_size_mismatch",
        "a decoded frame is 96x32, the header said 64x64",
    )


def test_the_frame_cap_holds_at_decode_too(tmp_path, monkeypatch):
    """decode_frames applies MAX_FRAME_PIXELS to the header it opens (a caller that skipped probe_video)."""
    data = size_changing_mkv(tmp_path / "capped.mkv", (96, 32))
    monkeypatch.setattr(video_probe, "MAX_FRAME_PIXELS", 64 * 64 - 1)
    with pytest.raises(SampleSkipped) as err:
        list(decode_frames(data, [0]))
    assert err.value.reason == "video_too_large" and "64x64 frames (4,096 pixels)" in err.value.detail


def test_the_encoder_path_skips_the_hostile_file_by_name(tmp_path):
    """The Qwen-VL encoder's frame decode (plan from the header, then decode) counts the same skip."""
    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.video import plan_video, video_file_frames

    data = size_changing_mkv(tmp_path / "hostile.mkv", (16000, 16000))
    preset = get_preset("qwen2.5-vl")
    plan = plan_video(probe_video(data), preset)
    assert plan.frame_indices == (0, 1)
    with pytest.raises(SampleSkipped) as err:
        video_file_frames(data, plan, preset)
    assert err.value.reason == "video_size_mismatch" and "refused before decoding" in err.value.detail


def _mpeg2(side: int, frames: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mpeg2video") as container:
        stream = container.add_stream("mpeg2video", rate=25)
        stream.width = stream.height = side
        frame = av.VideoFrame.from_ndarray(np.full((side, side, 3), 90, np.uint8), format="rgb24")
        for _ in range(frames):
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def test_a_resolution_change_inside_the_stream_is_refused_before_decoding():
    """Not only MJPEG: a raw MPEG-2 stream whose second sequence header switches from 64x64 to 2048x2048 stops
    at the first larger frame (the decoder reads one packet ahead, so frame 3 already meets it)."""
    data = _mpeg2(64, 4) + _mpeg2(2048, 2)
    assert probe_video(data).num_frames == 6 and probe_video(data).width == 64
    assert [image.size for image in decode_frames(data, [0, 2])] == [(64, 64)] * 2
    with pytest.raises(SampleSkipped) as err:
        list(decode_frames(data, [0, 4]))
    assert (err.value.reason, err.value.detail) == (
        "video_size_mismatch",
        "a frame larger than the header's was refused before decoding, the header said 64x64",
    )
