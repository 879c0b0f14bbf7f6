"""Generated video files for tests and benchmarks: moving bars over ramps, encoded with PyAV."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

#: container extension -> encoder
CODECS = {"mp4": "libx264", "webm": "libvpx-vp9", "mkv": "libx264", "mov": "libx264"}


def frame_rgb(i: int, width: int, height: int) -> np.ndarray:
    """Frame ``i``: a moving bar over horizontal and vertical ramps (so resizes and frame choice show)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.empty((height, width, 3), np.uint8)
    rgb[..., 0] = (x * 255 // max(width - 1, 1) + 9 * i) % 256
    rgb[..., 1] = (y * 255 // max(height - 1, 1)) % 256
    rgb[..., 2] = np.where((x + 3 * i) % 17 < 5, 230, 20)
    return rgb


def write_video(
    path: str | Path, num_frames: int, fps, width: int, height: int, gop: int | None = None, options: dict | None = None
) -> None:
    """Encode ``num_frames`` frames at ``fps`` (int, float or Fraction) into ``path`` (codec from its
    extension), a keyframe every ``gop`` frames when given; ``options`` go to the encoder."""
    ext = str(path).rsplit(".", 1)[-1]
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1001)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODECS[ext], rate=rate, options=options or {})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        for i in range(num_frames):
            frame = av.VideoFrame.from_ndarray(frame_rgb(i, width, height), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
