"""The pixel engine, model-neutral: images and video frames from bytes to a pack's pixel rows.

* :mod:`.decode`: header-only sizes, EXIF orientation, upright 8-bit RGB decoding (JPEG draft mode);
* :mod:`.backend`: the one backend dispatch (SIMD extension, numba, PIL + numpy) for PIL-exact
  resizing (:mod:`.pil_resample`) and the patch layout;
* :mod:`.layout`: value tables and HF's patch order (numpy), tensor views of the rows;
* :mod:`.rows`: :class:`PendingPatchRows`, resized frames whose layout runs into the pack's buffer.

A model's rules (which size an image or frame is resized to, grids, token counts, frame sampling)
live with the model, e.g. :mod:`energon_pack.qwen_vl.vision`; the engine reads only a
:class:`~.layout.PixelSpec` (patch, merge and temporal patch sizes, mean/std, storage dtype, filter).
"""

from .backend import PIXEL_KERNELS_ENV, RESAMPLE, compiled, layout, resize, warm
from .decode import (
    EXIF_ORIENTATION,
    SUPPORTED_MODES,
    decode_rgb,
    draft_target,
    exif_orientation,
    image_size_from_bytes,
    open_image,
    to_rgb_array,
    to_rgb_image,
)
from .layout import TORCH_DTYPES, PixelSpec, normalization_lut, normalize_pixels, pixels_to_torch, storage_table
from .pixel_simd import PIXEL_SIMD_ENV
from .rows import PendingPatchRows

__all__ = [
    "EXIF_ORIENTATION",
    "PIXEL_KERNELS_ENV",
    "PIXEL_SIMD_ENV",
    "RESAMPLE",
    "SUPPORTED_MODES",
    "TORCH_DTYPES",
    "PendingPatchRows",
    "PixelSpec",
    "compiled",
    "decode_rgb",
    "draft_target",
    "exif_orientation",
    "image_size_from_bytes",
    "layout",
    "normalization_lut",
    "normalize_pixels",
    "open_image",
    "pixels_to_torch",
    "resize",
    "storage_table",
    "to_rgb_array",
    "to_rgb_image",
    "warm",
]
