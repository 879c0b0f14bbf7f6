"""Frames bounded by what is decoded, not only by what the header says: a Matroska MJPEG file whose header (and
first frame) says 64x64 while a later packet holds a 16000x16000 JPEG (1 MB of zero scan data: a 256-megapixel
frame) peaked at 3.8 GB in the encoder before its ``video_size_mismatch`` skip; the decoder now refuses that frame
before allocating it."""

import json
import struct
import subprocess
import sys

import av
import numpy as np
import pytest

from energon_pack.errors import SampleSkipped
from energon_pack.video import decode_frames, probe_video
from energon_pack.video import probe as video_probe


def _segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


def flat_gray_jpeg(width: int, height: int) -> bytes:
    """A baseline grayscale JPEG of ``width`` x ``height`` mid-grey pixels built by hand: its DC and AC Huffman
    tables each hold one 1-bit code (DC difference 0, end of block), so every 8x8 block is two zero bits and the
    file stays small (16000 x 16000: 1 MB) while a decoder still produces every pixel."""
    table = bytes([1] + [0] * 15) + b"\x00"  # one code of length 1, for symbol 0
    return b"".join(
        (
            b"\xff\xd8",
            _segment(0xDB, b"\x00" + bytes([1] * 64)),  # quantization table 0
            _segment(0xC0, b"\x08" + struct.pack(">HH", height, width) + b"\x01\x01\x11\x00"),  # one component
            _segment(0xC4, b"\x00" + table + b"\x10" + table),  # DC table 0, AC table 0
            _segment(0xDA, b"\x01\x01\x00\x00\x3f\x00"),
            bytes(-(-2 * -(-width // 8) * -(-height // 8) // 8)),  # the scan: two zero bits per block
            b"\xff\xd9",
        )
    )


def size_changing_mkv(path, later: tuple[int, int]) -> bytes:
    """An MJPEG Matroska file whose header and first frame are 64x64, then one frame of ``later`` (width, height)
    muxed as a pre-encoded packet."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mjpeg", rate=25)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuvj420p"
        frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 90, np.uint8), format="rgb24")
        first = [*stream.encode(frame), *stream.encode()]
        for packet in first:
            container.mux(packet)
        packet = av.Packet(flat_gray_jpeg(*later))
        packet.stream, packet.time_base = stream, first[0].time_base
        packet.pts = packet.dts = first[0].pts + first[0].duration
        packet.duration, packet.is_keyframe = first[0].duration, True
        container.mux(packet)
    return path.read_bytes()


_CHILD = """
import json, resource, sys
from energon_pack.errors import SampleSkipped
from energon_pack.video import decode_frames
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    frames = [image.size for image in decode_frames(data, [0, 1])]
    outcome = ["ok", str(frames)]
except SampleSkipped as skip:
    outcome = [skip.reason, skip.detail]
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(outcome + [grown // 1024]))
"""


def test_a_16000x16000_frame_behind_a_64x64_header_is_refused_before_decoding(tmp_path):
    """In a child that only decodes: 3.4 GB more peak memory before (decoded, converted to RGB, then refused),
    now under 100 MB (the refused frame alone would be 256 MB of grey, 768 MB as RGB)."""
    data = size_changing_mkv(tmp_path / "hostile.mkv", (16000, 16000))
    assert len(data) < 1_100_000 and probe_video(data).width == 64  # the header checks see only 64x64
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "hostile.mkv")], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    reason, detail, grown_mb = json.loads(child.stdout)
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
