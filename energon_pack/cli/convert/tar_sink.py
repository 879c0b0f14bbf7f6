"""The shard writer: webdataset's ``TarWriter(path, mtime=0, encoder=False)`` with the standard library
only, byte for byte (``import webdataset`` imports torch, which costs a convert two seconds per process)."""

from __future__ import annotations

import io
import tarfile
from typing import Any


class TarSink:
    """Write samples (``{"__key__": KEY, PART: bytes | str, ...}``) to a new tar as ``KEY.PART`` members,
    parts in sorted order, with webdataset's member fields (mode 0444, owner ``bigdata``, mtime 0)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 (closed in close())
        self._tar = tarfile.open(fileobj=self._file, mode="w|")

    def write(self, sample: dict[str, Any]) -> None:
        key = sample["__key__"]
        for part in sorted(sample):
            if part.startswith("_"):
                continue
            value = sample[part]
            data = value.encode("utf-8") if isinstance(value, str) else value
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ValueError(f"{part} doesn't map to bytes ({type(value)})")
            info = tarfile.TarInfo(f"{key}.{part}")
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            info.uname = info.gname = "bigdata"
            self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self._tar.close()
        self._file.close()

    def __enter__(self) -> TarSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
