"""Images in, upright 8-bit RGB out: header-only sizes, EXIF orientation, JPEG draft decoding.

Model-neutral: the caller says which size an image of a given size is resized to (a function of
(height, width)), so JPEG draft mode can decode at a reduced scale without changing the target.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image

from ..errors import SampleSkipped
from .pil_pixels import STRIP_PIXELS

#: (shown height, shown width) -> (resized height, resized width): the model's resize rule
ResizedSize = Callable[[int, int], tuple[int, int]]

# Modes PIL converts to 8-bit RGB faithfully. 16-bit / 32-bit int / float modes would be clipped
# silently by convert("RGB"), so they are skipped as "unsupported_image_mode".
SUPPORTED_MODES = frozenset(
    {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}
)


EXIF_ORIENTATION = 0x0112
#: EXIF orientation -> the transpose that shows the image upright (PIL.ImageOps.exif_transpose's map)
_ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def exif_orientation(img: Image.Image) -> int:
    """The EXIF Orientation (1-8) of an opened image, read from its header: 1 when absent or invalid.

    PIL reads EXIF (and the XMP ``tiff:Orientation`` fallback, as ``exif_transpose`` does) at
    open time for JPEG, WebP and TIFF, so no pixel is decoded. A PNG whose ``eXIf`` chunk comes
    after the image data would need a decode to see it: it counts as 1 here, and the decode
    phase's size check turns the disagreement into a counted ``image_size_mismatch``.
    """
    try:
        if img.format == "PNG" and "exif" not in img.info and not getattr(img, "_exif", None):
            return 1
        value = img.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # malformed EXIF: treat as upright (both phases agree)
        return 1
    return value if isinstance(value, int) and value in _ORIENTATION_TRANSPOSE else 1


def image_size_from_bytes(data: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image *as displayed*, read from its header only (PIL lazy
    open, no decode): EXIF orientations 5-8 (rotated by 90 degrees) swap width and height, as
    transformers' ``load_image`` (``PIL.ImageOps.exif_transpose``) does before resizing."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            orientation = exif_orientation(img)
    except Exception as exc:  # PIL raises many types for garbage
        raise SampleSkipped("corrupt_image", f"unreadable image header: {type(exc).__name__}: {exc}") from None
    if width <= 0 or height <= 0:
        raise SampleSkipped("corrupt_image", f"zero-size image ({width}x{height})")
    return (height, width) if orientation >= 5 else (width, height)


def open_image(data: bytes | Image.Image) -> Image.Image:
    """A decoded PIL image from bytes (or a PIL image), upright: the EXIF orientation is applied
    like ``PIL.ImageOps.exif_transpose`` (what transformers' ``load_image`` does); SampleSkipped
    when it cannot be decoded."""
    try:
        if isinstance(data, Image.Image):
            img = data
            img.load()
        else:
            img = Image.open(io.BytesIO(data))
            img.load()
        orientation = exif_orientation(img)
        if orientation != 1:
            img = img.transpose(_ORIENTATION_TRANSPOSE[orientation])
    except Exception as exc:
        raise SampleSkipped("corrupt_image", f"cannot decode image: {type(exc).__name__}: {exc}") from None
    if img.width <= 0 or img.height <= 0:
        raise SampleSkipped("corrupt_image", f"zero-size image ({img.width}x{img.height})")
    return img


def _on_white(img: Image.Image) -> Image.Image:
    """RGB of ``img`` composited on opaque white (``convert_to_rgb``'s RGBA conversion, ``alpha_composite`` and
    RGB conversion, all per pixel), a strip of rows at a time for an image over one strip: the output and a strip
    in memory, not up to four full-size RGBA copies (an 80-megapixel RGBA PNG's encode peaked +1528 MB, now +677)."""
    step = max(1, STRIP_PIXELS // img.width)
    out = None if img.height <= step else Image.new("RGB", img.size)
    for y0 in range(0, img.height, step):
        box = (0, y0, img.width, min(img.height, y0 + step))
        rgba = (img if out is None else img.crop(box)).convert("RGBA")
        rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
        if out is None:
            return rgb
        out.paste(rgb, box)
    return out


def to_rgb_image(img: Image.Image) -> Image.Image:
    """8-bit RGB like transformers' ``convert_to_rgb``: transparency composited on white. An RGB
    image is returned as is (no copy: a decoded 8000x8000 photo is 192 MB)."""
    if img.mode not in SUPPORTED_MODES:
        raise SampleSkipped("unsupported_image_mode", f"image mode {img.mode!r} is not 8-bit RGB-convertible")
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        return _on_white(img)
    return img if img.mode == "RGB" else img.convert("RGB")


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3] like transformers' ``convert_to_rgb``: transparency composited on white."""
    return np.asarray(to_rgb_image(img), dtype=np.uint8)


def draft_target(img: Image.Image, resized_size: ResizedSize) -> tuple[int, int] | None:
    """(width, height) to ask JPEG draft mode for, in stored orientation, when the resize target
    is at most half the source in each side; None otherwise (or for non-JPEG)."""
    if img.format != "JPEG":
        return None
    width, height = img.size
    orientation = exif_orientation(img)
    shown_w, shown_h = (height, width) if orientation >= 5 else (width, height)
    rh, rw = resized_size(shown_h, shown_w)
    if orientation >= 5:
        rh, rw = rw, rh
    if 2 * rw > width or 2 * rh > height:
        return None
    return rw, rh


def decode_rgb(image: Image.Image | bytes, resized_size: ResizedSize, jpeg_draft: bool) -> tuple[Image.Image, int, int]:
    """(upright 8-bit RGB image, target height, target width), the target ``resized_size(height, width)``.

    With ``jpeg_draft`` a JPEG whose target is at most half its size in each side is
    decoded at a reduced scale (PIL draft: 1/2, 1/4 or 1/8, never below the target); the target
    still comes from the *full* header size (EXIF orientation included, read at open time for
    JPEG), so grids and token counts never change. Everything else decodes in full."""
    if jpeg_draft and isinstance(image, (bytes, bytearray)):
        try:
            img = Image.open(io.BytesIO(image))
            target = draft_target(img, resized_size)
            if target is not None:
                full_w, full_h = img.size
                orientation = exif_orientation(img)
                img.draft(img.mode, target)
        except SampleSkipped:
            raise
        except Exception as exc:
            raise SampleSkipped("corrupt_image", f"cannot decode image: {type(exc).__name__}: {exc}") from None
        if target is not None:
            shown_h, shown_w = (full_w, full_h) if orientation >= 5 else (full_h, full_w)
            rgb = to_rgb_image(open_image(img))
            return (rgb, *resized_size(shown_h, shown_w))
        image = img  # not a draft case: full decode of the opened image
    rgb = to_rgb_image(open_image(image))
    rh, rw = resized_size(rgb.height, rgb.width)
    return rgb, rh, rw
