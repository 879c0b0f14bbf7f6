"""Read, check and name the media a record refers to: paths confined to the allowed roots, regular
files within the size cap, image / video headers checked before the rest is read, formats sniffed
from the bytes (stored as they are), and the sampled JPEG frames of ``--layout bridge``."""

from __future__ import annotations

import base64
import binascii
import io
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from energon_pack.energon.media_store import sha256_hex
from energon_pack.errors import SampleSkipped

from .options import _Context
from .summary import _mb

HEADER_BYTES = 1 << 16  # read and checked before the rest of an image file
#: Leading bytes of the formats the loader reads (MPO is JPEG); anything else must be named by PIL from the header.
_IMAGE_MAGIC = (b"\xff\xd8", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")

#: PIL format -> member extension (an extension the loader's cooker recognises as an image).
PIL_EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif", "TIFF": "tiff"}
#: container format (FFmpeg's demuxer name) -> member extension the loader reads as a video
VIDEO_FORMAT_EXTENSIONS = {"mov,mp4,m4a,3gp,3g2,mj2": "mp4", "matroska,webm": "mkv", "avi": "avi"}


def media_roots(source: Path, image_root: Path | None, dataset_dir: Path | None = None) -> tuple[str, ...]:
    """The folders a relative media path is looked up in, in order; the first that holds it is used (all of them
    count as roots for the path confinement). ``image_root`` alone when given. Else guessed from what LLaVA and
    LLaMA-Factory files mean: the source's own folder (LLaVA files shipped beside their images), then the folder of
    the LLaMA-Factory ``dataset_info.json`` that names or holds the source (its ``media_dir`` default, the data
    folder: ``data/mllm_demo_data/1.jpg`` from ``data/sub/x.json``), then the current folder (where LLaMA-Factory,
    run from its checkout, opens a path it found nowhere else)."""
    if image_root is not None:
        return (os.path.abspath(image_root),)
    folder = Path(os.path.abspath(source if source.is_dir() else source.parent))
    if dataset_dir is None:  # a dataset_info.json beside the file or up to two folders above it
        dataset_dir = next((d for d in (folder, *folder.parents[:2]) if (d / "dataset_info.json").is_file()), None)
    try:
        cwd: tuple = (os.getcwd(),)
    except FileNotFoundError:  # the current folder was deleted: not a root
        cwd = ()
    roots = (folder, *((dataset_dir,) if dataset_dir is not None else ()), *cwd)
    return tuple(dict.fromkeys(os.path.abspath(r) for r in roots))


def _lookup(rel: Path, roots: tuple) -> tuple[Path, str]:
    """(path, root) of a relative media path: under the first root that holds it (a dangling link included, so the
    confinement check names it), else under the first root (where a ``missing_*`` skip says it was looked for)."""
    for root in roots:
        if os.path.lexists(Path(root) / rel):
            return Path(root) / rel, root
    return Path(roots[0]) / rel, roots[0]


def _read_media(
    ref: Any, i: int, ctx: _Context, kind: str = "image", found: Counter | None = None
) -> tuple[bytes, str]:
    """(encoded bytes, where they came from) of one image (or ``kind="video"``) value; ``found`` counts the
    relative paths found per media root."""
    if isinstance(ref, memoryview):
        ref = ref.tobytes()
    if isinstance(ref, (bytes, bytearray)):
        _check_size(len(ref), f"{kind} {i}: inline bytes", ctx)
        return bytes(ref), "inline bytes"
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            data, _ = _read_media(ref["bytes"], i, ctx, kind, found)
            return data, f"bytes of {ref['path']}" if ref.get("path") else "inline bytes"
        for key in ("path", "url", kind, f"{kind}_url"):
            if ref.get(key) not in (None, ""):
                return _read_media(ref[key], i, ctx, kind, found)
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: dict without bytes/path ({sorted(ref)})")
    if not isinstance(ref, str):
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: {type(ref).__name__} value")
    if ref.startswith("data:"):
        _check_size(len(ref) * 3 // 4, f"{kind} {i}: data URI", ctx)
        try:
            return base64.b64decode(ref.split(",", 1)[1], validate=False), "data URI"
        except (IndexError, binascii.Error, ValueError) as exc:
            raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: bad data URI ({exc})") from None
    if ref.startswith(("http://", "https://")):
        raise SampleSkipped(f"remote_{kind}", f"{kind} {i}: {ref[:120]}")
    if "\x00" in ref:
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: the path holds a NUL byte ({ref[:120]!r})")
    path = Path(ref[7:] if ref.startswith("file://") else ref)
    relative = not path.is_absolute()
    if relative:
        path, root = _lookup(path, ctx.media_roots or (ctx.image_root,))
        if found is not None and os.path.lexists(path):
            found[root] += 1
    try:
        return _read_file(path, i, ctx, kind), str(path)
    except SampleSkipped as skip:
        if relative and skip.reason == f"missing_{kind}":
            raise _MissingRelative(skip.reason, skip.detail) from None
        raise
    except UnicodeEncodeError:
        raise SampleSkipped(f"bad_{kind}_ref", f"{kind} {i}: the path is not valid text ({ref[:120]!r})") from None


class _MissingRelative(SampleSkipped):
    """A ``missing_image`` skip of a relative path (counted for the --image-root hint)."""


def _check_size(size: int, what: str, ctx: _Context) -> None:
    if size > ctx.max_media_bytes:
        raise SampleSkipped("media_too_large", f"{what}: {_mb(size)} > --max-media-mb {ctx.max_media_bytes >> 20}")


def _read_file(path: Path, i: int, ctx: _Context, kind: str = "image") -> bytes:
    """The bytes of one image (or video) file, read only when it resolves inside ``ctx.roots``, is a
    regular file no larger than the cap and starts with an image (video container) header."""
    what = f"{kind} {i}: {path}"
    real = os.path.realpath(path)
    if not ctx.allow_outside and not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in ctx.roots):
        raise SampleSkipped(
            "path_outside_root",
            f"{what} resolves to {real}, outside {' and '.join(ctx.roots)} (pass --allow-outside-paths to read it)",
        )
    try:
        _check_regular(os.stat(real), what, ctx)
        # O_NOFOLLOW: a symlink swapped in after realpath fails instead of leading out of the roots
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SampleSkipped(f"missing_{kind}", f"{what} not found") from None
    except OSError as exc:
        raise SampleSkipped(f"unreadable_{kind}", f"{what}: {exc.strerror or exc}") from None
    try:
        _check_regular(os.fstat(fd), what, ctx)  # what was opened, should the path have changed meanwhile
        head = _read_upto(fd, HEADER_BYTES)
        if not (_looks_like_image if kind == "image" else _looks_like_video)(head):
            raise SampleSkipped(
                "not_an_image" if kind == "image" else "not_a_video", f"{what}: its first bytes are no {kind} header"
            )
        data = head + _read_upto(fd, ctx.max_media_bytes + 1 - len(head))
        _check_size(len(data), what, ctx)
        return data
    except OSError as exc:
        raise SampleSkipped(f"unreadable_{kind}", f"{what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _check_regular(st: os.stat_result, what: str, ctx: _Context) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )
        raise SampleSkipped("not_a_regular_file", f"{what} is {kind}")
    _check_size(st.st_size, what, ctx)


def _read_upto(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _looks_like_image(head: bytes) -> bool:
    """An image header among the first bytes: a known magic number, else a format PIL names."""
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return True
    from PIL import Image

    try:
        with Image.open(io.BytesIO(head)):
            return True
    except Exception:  # UnidentifiedImageError, or a plugin failing on a non-image
        return False


def _looks_like_video(head: bytes) -> bool:
    """A video container header: an MP4/MOV box, Matroska/WebM's EBML magic, or RIFF AVI."""
    return (
        head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip")
        or head.startswith(b"\x1aE\xdf\xa3")
        or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")
    )


_VIDEO_EXTS: dict[str, str] = {}  # SHA-256 of a video file -> its extension, per worker: a reused clip is probed once


def _sniff_video(data: bytes, what: str) -> str:
    """Member extension of a video file, verified by its header (what the loader reads before
    costing it): a readable video stream with a frame rate, a size and at least 2 frames. The same bytes
    (a clip many records use) are probed once per process."""
    key = sha256_hex(data)
    if key not in _VIDEO_EXTS:
        _VIDEO_EXTS[key] = _probe_video_ext(data, what)
    return _VIDEO_EXTS[key]


def _probe_video_ext(data: bytes, what: str) -> str:
    from energon_pack.video.probe import open_container, probe_video
    from energon_pack.video.sampling import FrameSampling, smart_nframes

    try:
        header = probe_video(data)
        smart_nframes(header.num_frames, header.fps, FrameSampling())
        with open_container(data) as container:
            name = container.format.name
    except SampleSkipped as skip:
        raise SampleSkipped(skip.reason, f"{what}: {skip.detail}") from None
    ext = VIDEO_FORMAT_EXTENSIONS.get(name)
    if ext is None:
        raise SampleSkipped(
            "not_a_video", f"{what}: container {name!r} is none the loader reads (mp4/mov, mkv/webm, avi)"
        )
    return ext


#: JPEG quality of the frames ``--layout bridge`` writes for a video
BRIDGE_FRAME_QUALITY = 95


def sampled_jpeg_frames(data: bytes, what: str, preset: str) -> list[bytes]:
    """The frames qwen-vl-utils' default sampling takes from a video file, as JPEG bytes (Bridge's
    frame-list layout), each at the size ``preset``'s frame-list rule trains it at (PIL's resize with the
    preset's filter, as the loader does): the loader's own resize is then the identity, and a shard holds
    no pixel it would not train. SampleSkipped when decoding fails or the plan refuses the video (too
    large for the pixel caps, too few frames, an extreme aspect ratio)."""

    from energon_pack.qwen_vl import get_preset
    from energon_pack.qwen_vl.video import plan_video
    from energon_pack.qwen_vl.vision import RESAMPLE, resized_video_size
    from energon_pack.video import decode_frames, probe_video

    vision = get_preset(preset)
    try:
        header = probe_video(data)
        plan = plan_video(header, vision)  # qwen-vl-utils' frame indices, within the pixel caps
        height, width = resized_video_size(plan.num_frames, header.height, header.width, vision)
        frames = []
        for image in decode_frames(data, plan.frame_indices):
            if image.size != (header.width, header.height):
                raise SampleSkipped(
                    "video_size_mismatch",
                    f"a frame is {image.size[0]}x{image.size[1]}, the header said {header.width}x{header.height}",
                )
            buf = io.BytesIO()
            resized = image.resize((width, height), resample=RESAMPLE[vision.resample])
            resized.save(buf, format="JPEG", quality=BRIDGE_FRAME_QUALITY, subsampling=0)  # 4:4:4: no chroma loss
            frames.append(buf.getvalue())
    except SampleSkipped as skip:
        raise SampleSkipped(skip.reason, f"{what}: {skip.detail}") from None
    except ValueError as exc:  # the resize rules' aspect-ratio check
        raise SampleSkipped("extreme_aspect_ratio", f"{what}: {exc}") from None
    return frames


def _sniff(data: bytes, what: str, verify: str) -> str:
    """Member extension of encoded image bytes (PIL header read; full decode with verify='decode')."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise SampleSkipped("corrupt_image", f"{what}: empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (w, h) = img.format, img.size
            if verify == "decode":
                img.load()
    except UnidentifiedImageError:
        raise SampleSkipped("corrupt_image", f"{what}: not an image PIL recognises ({len(data)} bytes)") from None
    except Exception as exc:  # PIL raises many types for garbage
        raise SampleSkipped("corrupt_image", f"{what}: {type(exc).__name__}: {exc}"[:240]) from None
    if w <= 0 or h <= 0:
        raise SampleSkipped("corrupt_image", f"{what}: zero size {w}x{h}")
    ext = PIL_EXTENSIONS.get(fmt or "")
    if ext is None:
        raise SampleSkipped("unsupported_image_format", f"{what}: {fmt}")
    return ext
