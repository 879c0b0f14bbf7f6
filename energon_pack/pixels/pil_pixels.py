"""A decoded RGB image's pixels where PIL keeps them: a zero-copy uint8 view.

``np.asarray(image)`` packs PIL's 4-byte RGBX pixels into a new RGB buffer (0.2 ms for a
0.3-megapixel photo, a tenth of the decode). The SIMD resampling passes and layout read 4-byte
pixels in place (:mod:`.pixel_simd`), so the worker skips that copy: Pillow (11.2+) exports an
image's memory through the Arrow C data interface (``Image.__arrow_c_array__``, a stable ABI:
https://arrow.apache.org/docs/format/CDataInterface.html), and :func:`rgbx_view` wraps it as a
read-only [H, W, 3] array with 4-byte pixel strides that keeps the export (and so the image's
memory) alive as long as the array lives. An image too large for one block is read a strip of rows at a time
(:func:`rgb_rows`) instead of through one full-size RGB copy.
"""

from __future__ import annotations

import ctypes

import numpy as np
from PIL import Image

#: pixels of a large image converted or resized at a time (a strip of rows): Pillow's block of 4-byte pixels (16 MB),
#: so an 80-megapixel photo costs its decode and a few strips, not several full-size copies
STRIP_PIXELS = 1 << 22


class _ArrowSchema(ctypes.Structure):
    pass


_ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_void_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowSchema))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]


class _ArrowArray(ctypes.Structure):
    pass


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def rgbx_view(img: Image.Image) -> np.ndarray | None:
    """Read-only uint8 [H, W, 3] view of an RGB image's pixels in PIL's own memory (strides
    (4W, 4, 1): the fourth byte of each pixel is skipped), or None where there is none: not
    mode RGB, a Pillow without Arrow export, an export of another layout, or rows that are not
    one block (images over Pillow's block size, 16 MB: 4 megapixels)."""
    if img.mode != "RGB" or not hasattr(img, "__arrow_c_array__"):
        return None
    try:
        schema_capsule, array_capsule = img.__arrow_c_array__()
    except ValueError:  # "Image rows are not contiguous in memory."
        return None
    schema = _ArrowSchema.from_address(_capsule_pointer(schema_capsule, b"arrow_schema"))
    array = _ArrowArray.from_address(_capsule_pointer(array_capsule, b"arrow_array"))
    width, height = img.size
    if (
        schema.format != b"+w:4"
        or schema.n_children != 1
        or schema.children[0].contents.format != b"C"
        or array.n_children != 1
        or array.length != width * height
        or width * height == 0
    ):
        return None
    child = array.children[0].contents
    if child.n_buffers != 2 or not child.buffers[1]:
        return None
    start = child.buffers[1] + child.offset + 4 * array.offset
    memory = (ctypes.c_uint8 * (4 * width * height)).from_address(start)
    memory.export = (schema_capsule, array_capsule)  # released (PIL's reference dropped) with the view
    view = np.frombuffer(memory, dtype=np.uint8).reshape(height, width, 4)[:, :, :3]
    view.flags.writeable = False
    return view


def rgb_rows(img: Image.Image, y0: int, y1: int) -> np.ndarray:
    """uint8 [y1 - y0, W, 3]: rows [y0, y1) of an RGB image, copied out of PIL without copying the rest."""
    strip = img.crop((0, y0, img.width, y1))
    view = rgbx_view(strip)
    return view if view is not None else np.asarray(strip, dtype=np.uint8)
