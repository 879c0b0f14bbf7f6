"""A video's frame count, frame rate and size from its container, without decoding a frame.

MP4/MOV store the frame count in the header (the sample table); Matroska/WebM do not, so their
packets are counted by demuxing (reading packet headers, no decode). The frame rate is the
stream's average rate, which is what qwen-vl-utils' readers (decord ``get_avg_fps``, torchcodec
``average_fps``) report. Rotation metadata and non-square pixels are not applied (decord does not
apply them either).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SampleSkipped

if TYPE_CHECKING:  # PyAV loads FFmpeg's libraries: imported where a video is read, not with the package
    import av

#: sample members (``KEY.0.mp4``, ...) read as video files
VIDEO_EXTENSIONS = ("mp4", "m4v", "mov", "webm", "mkv", "avi")
#: the most pixels one video frame may have, checked from the header before anything is decoded (the spirit of PIL's
#: ``Image.MAX_IMAGE_PIXELS``): 8K UHD (7680 x 4320). A 25 KB file can declare 16000 x 16000 frames, and each decoded
#: frame then costs gigabytes. Raise it (``energon_pack.video.probe.MAX_FRAME_PIXELS = ...``, before the loader
#: starts its workers) to train larger frames.
MAX_FRAME_PIXELS = 7680 * 4320
#: the most source pixels the sampled frames of one video may have together (decoded one at a time, each costs its
#: decode): 2^31, e.g. 1,000 full-HD frames. Raise it like :data:`MAX_FRAME_PIXELS`.
MAX_SAMPLE_PIXELS = 1 << 31


@dataclass(frozen=True)
class VideoHeader:
    """What the container says about the first video stream."""

    num_frames: int
    fps: float  # average frame rate of the stream
    width: int
    height: int
    duration: float  # seconds (stream duration, else the container's; num_frames / fps when neither is stored)


def open_container(data: bytes) -> av.container.InputContainer:
    """PyAV input container over encoded bytes; SampleSkipped("corrupt_video") when FFmpeg refuses them."""
    import av

    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except Exception as exc:  # av raises many types (InvalidDataError, ValueError, ...)
        raise SampleSkipped("corrupt_video", f"unreadable video container: {type(exc).__name__}: {exc}"[:240]) from None


def _check_image_pipe(data: bytes) -> None:
    """An image stored as a video member (FFmpeg reads it as a one-frame ``png_pipe``/``jpeg_pipe``... and decodes
    its first frame to learn the size, before any header check of ours): its size from PIL's header read (no
    decode), refused as ``video_too_large`` over :data:`MAX_FRAME_PIXELS`."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height, kind = *image.size, image.format
    except Image.DecompressionBombError as exc:
        raise SampleSkipped("video_too_large", f"an image stored as a video: {exc}"[:240]) from None
    except Exception:  # not an image PIL knows: a real container, for FFmpeg to read
        return
    if width * height > MAX_FRAME_PIXELS:
        raise SampleSkipped(
            "video_too_large",
            f"a {kind} image of {width}x{height} ({width * height:,} pixels) stored as a video exceeds "
            f"energon_pack.video.probe.MAX_FRAME_PIXELS ({MAX_FRAME_PIXELS:,}); raise it to decode such frames",
        )


def check_frame_pixels(width: int, height: int) -> None:
    """SampleSkipped ``video_too_large`` when frames of ``width`` x ``height`` exceed :data:`MAX_FRAME_PIXELS`."""
    if width * height > MAX_FRAME_PIXELS:
        raise SampleSkipped(
            "video_too_large",
            f"{width}x{height} frames ({width * height:,} pixels) exceed energon_pack.video.probe.MAX_FRAME_PIXELS "
            f"({MAX_FRAME_PIXELS:,}); raise it to decode such frames",
        )


def probe_video(data: bytes) -> VideoHeader:
    """The :class:`VideoHeader` of an encoded video; SampleSkipped ``corrupt_video`` when there is
    no readable video stream, no frame rate, no frame or no size, ``video_too_large`` over the pixel cap."""
    import av

    _check_image_pipe(data)
    with open_container(data) as container:
        if not container.streams.video:
            raise SampleSkipped("corrupt_video", "the container has no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        width, height = stream.codec_context.width, stream.codec_context.height
        num_frames = stream.frames
        if num_frames <= 0:
            try:  # Matroska/WebM: no count in the header; count packets (demux only, nothing decoded)
                num_frames = sum(1 for packet in container.demux(stream) if packet.size > 0)
            except Exception as exc:
                raise SampleSkipped(
                    "corrupt_video", f"cannot read packets: {type(exc).__name__}: {exc}"[:240]
                ) from None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        else:
            duration = num_frames / float(rate) if rate else 0.0
    if not rate or float(rate) <= 0:
        raise SampleSkipped("corrupt_video", "the video stream has no frame rate")
    if num_frames <= 0:
        raise SampleSkipped("corrupt_video", "the video stream has no frames")
    if width <= 0 or height <= 0:
        raise SampleSkipped("corrupt_video", f"the video stream has no size ({width}x{height})")
    check_frame_pixels(width, height)
    return VideoHeader(num_frames=num_frames, fps=float(rate), width=width, height=height, duration=duration)
