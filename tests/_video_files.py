"""Small generated video files for the video tests (energon_pack.bench.video_files)."""

from energon_pack.bench.video_files import write_video

__all__ = ["video_bytes", "write_video"]


def video_bytes(
    num_frames: int, fps, width: int, height: int, tmp_path, ext: str = "mp4", gop: int | None = None
) -> bytes:
    path = tmp_path / f"v{num_frames}_{width}x{height}_{gop}.{ext}"
    write_video(path, num_frames, fps, width, height, gop)
    return path.read_bytes()
