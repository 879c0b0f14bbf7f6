"""Video files, model-neutral: what a container header says, which frames to take, decoding only those.

* :mod:`.probe`: frame count, frame rate, duration and size from the container (no frame decoded),
  so a packer can cost a video before deciding to keep it;
* :mod:`.sampling`: time-based frame sampling (qwen-vl-utils' rule: a target fps, min/max frames,
  counts rounded to a frame factor, evenly spaced indices);
* :mod:`.decode`: decode the chosen frames of a selected sample, one frame in memory at a time.

Decoding uses PyAV (FFmpeg bundled in its wheel). Model rules (resize, grids, token counts, the
M-RoPE time scale) live with the model: :mod:`energon_pack.qwen_vl.video`; the decoded frames are resized
and laid out by the pixel engine images use too, :mod:`energon_pack.pixels`.
"""

from .decode import decode_frames
from .probe import VIDEO_EXTENSIONS, VideoHeader, probe_video
from .sampling import FrameSampling, sample_frame_indices, smart_nframes

__all__ = [
    "VIDEO_EXTENSIONS",
    "FrameSampling",
    "VideoHeader",
    "decode_frames",
    "probe_video",
    "sample_frame_indices",
    "smart_nframes",
]
