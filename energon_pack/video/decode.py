"""Decode the chosen frames of an encoded video, one frame held at a time.

Frame ``i`` is the i-th frame in presentation order, i.e. the i-th smallest packet timestamp (how
decord, qwen-vl-utils' reader, indexes frames). The packet timestamps and keyframes are read first
(demux, no decode); then, for each wanted frame whose nearest keyframe lies past what was decoded
so far, the decoder seeks to that keyframe, so a long video with sparse samples decodes about one
GOP per sampled frame instead of every frame. Streams without packet timestamps, or whose frames share
timestamps, are decoded from the start. Each wanted frame is handed over as an RGB PIL image before
the next one is decoded: memory is one source frame plus the caller's output.

That frame is the header's size, not only what the header says: a container may declare 64x64 and carry
16000x16000 frames (an MJPEG Matroska file of 3.4 MB then peaked at 3.8 GB before its size check). The decoder is
told to refuse any frame of more pixels than the header's (FFmpeg's ``max_pixels``, checked when a frame's size is
parsed, before its buffer is allocated), and every decoded frame of another size stops the decode at once, before it
is converted: SampleSkipped ``video_size_mismatch`` either way.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from PIL import Image

from ..errors import SampleSkipped
from .probe import check_frame_pixels, open_container

if TYPE_CHECKING:  # PyAV loads FFmpeg's libraries: imported where a video is read, not with the package
    import av


#: pixels a decoder may add to each side of the header's size: FFmpeg checks a frame buffer at its width rounded up
#: to the SIMD stride (up to 64) and some codecs decode at a 16-aligned coded size
ALIGN_SLACK = 128


def _corrupt(exc: Exception) -> SampleSkipped:
    return SampleSkipped("corrupt_video", f"decoding failed: {type(exc).__name__}: {exc}"[:240])


def _bound_decoder(stream) -> tuple[int, int]:
    """The header's (width, height), within :data:`~.probe.MAX_FRAME_PIXELS`, once the stream's decoder is told
    to refuse larger frames before allocating them (``max_pixels``, with :data:`ALIGN_SLACK` per side)."""
    context = stream.codec_context
    width, height = context.width, context.height
    if width <= 0 or height <= 0:
        raise SampleSkipped("corrupt_video", f"the video stream has no size ({width}x{height})")
    check_frame_pixels(width, height)
    context.options = {**(context.options or {}), "max_pixels": str((width + ALIGN_SLACK) * (height + ALIGN_SLACK))}
    return width, height


def _header_sized(frames: Iterator[av.VideoFrame], size: tuple[int, int]) -> Iterator[av.VideoFrame]:
    """``frames``, each checked against the header's size before anything converts or keeps it."""
    for frame in frames:
        if (frame.width, frame.height) != size:
            raise SampleSkipped(
                "video_size_mismatch",
                f"a decoded frame is {frame.width}x{frame.height}, the header said {size[0]}x{size[1]}",
            )
        yield frame


def _failure(exc: Exception, stream, size: tuple[int, int]) -> SampleSkipped:
    """The skip for a decoder error: ``video_size_mismatch`` when the decoder had met a frame of another size (one
    over ``max_pixels`` leaves it at 0x0), else ``corrupt_video``."""
    shown = stream.codec_context.width, stream.codec_context.height
    if shown == size:
        return _corrupt(exc)
    said = f"the header said {size[0]}x{size[1]}"
    if 0 in shown:
        return SampleSkipped(
            "video_size_mismatch", f"a frame larger than the header's was refused before decoding, {said}"
        )
    return SampleSkipped("video_size_mismatch", f"a frame is {shown[0]}x{shown[1]}, {said}: decoding failed")


def packet_timeline(data: bytes) -> tuple[list[int], list[int]] | None:
    """(every frame's timestamp in presentation order, keyframe timestamps) from packet headers;
    None when a packet has no timestamp."""
    import av

    with open_container(data) as container:
        stream = container.streams.video[0]
        pts, keys = [], []
        try:
            for packet in container.demux(stream):
                if packet.size == 0:  # the demuxer's flush packet
                    continue
                if packet.pts is None:
                    return None
                pts.append(packet.pts)
                if packet.is_keyframe:
                    keys.append(packet.pts)
        except av.FFmpegError as exc:
            raise _corrupt(exc) from None
    return sorted(pts), sorted(keys)


def _sequential(
    container: av.container.InputContainer, stream, indices: Sequence[int], size: tuple[int, int]
) -> Iterator[Image.Image]:
    position = 0
    for index, frame in enumerate(_header_sized(container.decode(stream), size)):
        if index != indices[position]:
            continue
        image = frame.to_image()
        while position < len(indices) and indices[position] == index:
            yield image
            position += 1
        if position == len(indices):
            return
    raise SampleSkipped(
        "corrupt_video", f"the stream ended before frame {indices[position]} (of {len(indices)} wanted)"
    )


def _seeking(
    container: av.container.InputContainer, stream, targets: list[int], keys: list[int], size: tuple[int, int]
) -> Iterator[Image.Image]:
    frames, decoded = None, None  # the running decode and the last timestamp it gave
    position = 0
    while position < len(targets):
        target = targets[position]
        key = keys[max(bisect.bisect_right(keys, target) - 1, 0)] if keys else target
        if frames is None or decoded is None or key > decoded:
            container.seek(key, stream=stream, backward=True, any_frame=False)
            frames = _header_sized(container.decode(stream), size)
        for frame in frames:
            if frame.pts is None:
                raise SampleSkipped("corrupt_video", "a decoded frame has no timestamp")
            decoded = frame.pts
            if frame.pts < target:
                continue
            if frame.pts > target:
                raise SampleSkipped("corrupt_video", f"no frame at timestamp {target} (next: {frame.pts})")
            image = frame.to_image()
            while position < len(targets) and targets[position] == target:
                yield image
                position += 1
            break
        else:
            raise SampleSkipped("corrupt_video", f"the stream ended before timestamp {target}")


def decode_frames(data: bytes, indices: Sequence[int]) -> Iterator[Image.Image]:
    """RGB frames of ``data`` at ``indices`` (non-decreasing; a repeated index yields the frame again).

    SampleSkipped ``corrupt_video`` when FFmpeg fails mid-stream or the stream ends before the
    last wanted frame, ``video_size_mismatch`` at the first frame whose size is not the header's (one with more
    pixels is refused before it is decoded), ``video_too_large`` when the header's exceeds the frame cap."""
    indices = list(indices)
    if any(b < a for a, b in zip(indices, indices[1:])) or (indices and indices[0] < 0):
        raise ValueError(f"decode_frames needs non-decreasing non-negative indices, got {indices[:8]}...")
    if not indices:
        return
    timeline = packet_timeline(data)
    if timeline is not None and indices[-1] >= len(timeline[0]):
        raise SampleSkipped("corrupt_video", f"frame {indices[-1]} wanted, the stream has {len(timeline[0])}")
    with open_container(data) as container:
        stream = container.streams.video[0]
        size = _bound_decoder(stream)
        try:
            if timeline is None or len(set(timeline[0])) < len(timeline[0]):
                # no timestamps, or frames that share one (an MKV at 1e6 fps has millisecond timestamps): a seek
                # cannot tell those frames apart, so decode in order and count
                yield from _sequential(container, stream, indices, size)
            else:
                yield from _seeking(container, stream, [timeline[0][i] for i in indices], timeline[1], size)
        except SampleSkipped:
            raise
        except Exception as exc:  # av raises many types on corrupt data
            raise _failure(exc, stream, size) from None
