"""Decode the chosen frames of an encoded video, one frame held at a time.

Frames are counted in presentation order from the first one (the index qwen-vl-utils' readers
use). Decoding stops after the last wanted frame; streams are decoded with FFmpeg's default
threading. Each wanted frame is handed over as an RGB PIL image before the next is decoded, so
the caller (which resizes it into its output) bounds memory to one source frame plus its output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from PIL import Image

from ..errors import SampleSkipped
from .probe import open_container


def decode_frames(data: bytes, indices: Sequence[int]) -> Iterator[Image.Image]:
    """RGB frames of ``data`` at ``indices`` (non-decreasing; a repeated index yields the frame again).

    SampleSkipped ``corrupt_video`` when FFmpeg fails mid-stream or the stream ends before the
    last wanted frame."""
    if any(b < a for a, b in zip(indices, indices[1:])) or (indices and indices[0] < 0):
        raise ValueError(f"decode_frames needs non-decreasing non-negative indices, got {list(indices)[:8]}...")
    if not indices:
        return
    position = 0
    with open_container(data) as container:
        if not container.streams.video:
            raise SampleSkipped("corrupt_video", "the container has no video stream")
        stream = container.streams.video[0]
        try:
            for index, frame in enumerate(container.decode(stream)):
                if index != indices[position]:
                    continue
                image = frame.to_image()
                while position < len(indices) and indices[position] == index:
                    yield image
                    position += 1
                if position == len(indices):
                    return
        except SampleSkipped:
            raise
        except Exception as exc:  # av raises many types on corrupt data
            raise SampleSkipped("corrupt_video", f"decoding failed: {type(exc).__name__}: {exc}"[:240]) from None
    raise SampleSkipped("corrupt_video", f"the stream ended before frame {indices[position]} (of {len(indices)} wanted)")
