"""Patch rows decoded and resized but not laid out yet: what a pack's builder writes in place."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from . import backend
from .layout import TORCH_DTYPES, PixelSpec, frames_grid


class PendingPatchRows:
    """Patch rows decoded and resized, not laid out yet: the uint8 frames of one or more images or
    videos (a quarter of the float32 rows' bytes), and :meth:`write_into`, which runs the layout
    into the caller's tensor. The THD builder writes them straight into the pack's buffer (shared
    memory in a loader worker), so each value is written once, where before it went into a
    per-sample array and was then copied into the pack. Decoding happened already, so a corrupt
    image was a counted skip before any pack was built; the layout itself cannot fail.

    ``shape`` and ``dtype`` are those of the tensor :meth:`to_tensor` returns: exactly what
    the model's patchify functions give (e.g. Qwen-VL's ``patchify_image`` / ``patchify_video``),
    concatenated in order."""

    def __init__(self, items: Sequence[np.ndarray], preset: PixelSpec) -> None:
        self._items = list(items)  # uint8 frames [T, H, W, 3] (an image: T = 1)
        self.preset = preset
        self._rows = [math.prod(frames_grid(frames, preset)) for frames in self._items]
        self.shape = (sum(self._rows), preset.patch_dim)
        self.dtype = TORCH_DTYPES[preset.pixel_dtype]

    @classmethod
    def join(cls, parts: Sequence[PendingPatchRows]) -> PendingPatchRows:
        """The rows of ``parts`` one after another (e.g. a sample's images); one preset for all."""
        if not parts or any(part.preset != parts[0].preset for part in parts):
            raise ValueError("PendingPatchRows.join needs at least one part, all of one preset")
        return cls([item for part in parts for item in part._items], parts[0].preset)

    def write_into(self, out: torch.Tensor) -> None:
        """Lay the rows out into ``out`` (a contiguous CPU tensor of ``shape`` and ``dtype``)."""
        if (
            tuple(out.shape) != self.shape
            or out.dtype != self.dtype
            or out.device.type != "cpu"
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"PendingPatchRows.write_into: needs a contiguous CPU {self.dtype} tensor of shape "
                f"{self.shape}, got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        storage = out.view(torch.int16).numpy().view(np.uint16) if self.dtype == torch.bfloat16 else out.numpy()
        kernels = backend.compiled(self.preset.resample)
        start = 0
        for frames, rows in zip(self._items, self._rows):
            backend.layout(frames, self.preset, kernels, out=storage[start : start + rows])
            start += rows

    def to_tensor(self) -> torch.Tensor:
        """The rows as a new tensor of ``dtype``."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self.write_into(out)
        return out
