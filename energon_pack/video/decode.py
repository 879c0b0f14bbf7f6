"""Decode the chosen frames of an encoded video, one frame held at a time.

Frame ``i`` is the i-th frame in presentation order, i.e. the i-th smallest packet timestamp (how
decord, qwen-vl-utils' reader, indexes frames). The packet timestamps and keyframes are read first
(demux, no decode); then, for each wanted frame whose nearest keyframe lies past what was decoded
so far, the decoder seeks to that keyframe, so a long video with sparse samples decodes about one
GOP per sampled frame instead of every frame. Streams without packet timestamps, or whose frames share
timestamps, are decoded from the start. Each wanted frame is handed over as an RGB PIL image before
the next one is decoded: memory is one source frame plus the caller's output.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from PIL import Image

from ..errors import SampleSkipped
from .probe import open_container

if TYPE_CHECKING:  # PyAV loads FFmpeg's libraries: imported where a video is read, not with the package
    import av


def _corrupt(exc: Exception) -> SampleSkipped:
    return SampleSkipped("corrupt_video", f"decoding failed: {type(exc).__name__}: {exc}"[:240])


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


def _sequential(container: av.container.InputContainer, stream, indices: Sequence[int]) -> Iterator[Image.Image]:
    position = 0
    for index, frame in enumerate(container.decode(stream)):
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
    container: av.container.InputContainer, stream, targets: list[int], keys: list[int]
) -> Iterator[Image.Image]:
    frames, decoded = None, None  # the running decode and the last timestamp it gave
    position = 0
    while position < len(targets):
        target = targets[position]
        key = keys[max(bisect.bisect_right(keys, target) - 1, 0)] if keys else target
        if frames is None or decoded is None or key > decoded:
            container.seek(key, stream=stream, backward=True, any_frame=False)
            frames = container.decode(stream)
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
    last wanted frame."""
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
        try:
            if timeline is None or len(set(timeline[0])) < len(timeline[0]):
                # no timestamps, or frames that share one (an MKV at 1e6 fps has millisecond timestamps): a seek
                # cannot tell those frames apart, so decode in order and count
                yield from _sequential(container, stream, indices)
            else:
                yield from _seeking(container, stream, [timeline[0][i] for i in indices], timeline[1])
        except SampleSkipped:
            raise
        except Exception as exc:  # av raises many types on corrupt data
            raise _corrupt(exc) from None
