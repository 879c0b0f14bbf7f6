"""Line-offset index of a JSONL file, cached (never beside the file) with a fingerprint.

The index is the array of line *ends* (byte offset of each ``\\n``, or the file size for a last
line without one; in a file with no ``\\n`` at all, each lone ``\\r``: old Mac line endings): line ``i``
spans ``[ends[i-1] + 1, ends[i])``. It is built once with numpy
(``flatnonzero(chunk == 10)`` over chunks read with ``os.pread``, so memory stays bounded and a
file cut short under the scan is an error, not a SIGBUS) and saved
as ``<name>.<key>.idx.npy`` plus ``.idx.json`` holding a fingerprint of the source (size,
mtime, hashes of the first and last MiB) in ``jsonl/`` under the package's cache folder
(:func:`energon_pack.env.cache_dir`) or in ``cache_dir``; ``key`` hashes the file's identity
(resolved path, size, mtime_ns, inode), and writing a new entry drops the path's older ones.
A changed file, a corrupt or unreadable cache, or a version bump rebuilds it; a cache folder we
cannot write to keeps the index in memory. Derived per-line caches (e.g. lengths) reuse
:func:`file_fingerprint` and :func:`cache_path`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import mmap
import os
import re
import warnings
from pathlib import Path

import numpy as np

from ..errors import ConfigError

INDEX_VERSION = 2  # 2: CR-only files are split at \r
CHUNK_BYTES = 1 << 22  # 4 MiB per numpy scan: stays in cache (64 MiB chunks are ~2x slower)
HASH_BYTES = 1 << 20


def file_fingerprint(path: str | os.PathLike) -> dict:
    """Size + mtime + blake2b of the first and last MiB: cheap, and changes whenever the file does."""
    path = Path(path)
    st = path.stat()
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(HASH_BYTES))
        if st.st_size > HASH_BYTES:
            f.seek(max(HASH_BYTES, st.st_size - HASH_BYTES))
            h.update(f.read(HASH_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "hash": h.hexdigest()}


def cache_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, or ``jsonl/`` in the package's cache folder (never the data's own folder)."""
    from ..env import cache_dir as package_cache_dir

    return Path(cache_dir) if cache_dir is not None else package_cache_dir() / "jsonl"


def cache_key(path: str | os.PathLike) -> str:
    """``<path hash>-<identity hash>``: the resolved path, then its size, mtime_ns and inode."""
    resolved = str(Path(path).resolve())
    st = os.stat(resolved)
    where = hashlib.blake2b(resolved.encode("utf-8", "surrogateescape"), digest_size=6).hexdigest()
    what = hashlib.blake2b(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode(), digest_size=6).hexdigest()
    return f"{where}-{what}"


def cache_path(path: str | os.PathLike, suffix: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """``<name>.<cache_key><suffix>`` in :func:`cache_folder` (``cache_dir`` or the user cache)."""
    path = Path(path)
    return cache_folder(cache_dir) / f"{path.name}.{cache_key(path)}{suffix}"


_KEYED = re.compile(r"(?P<head>.+\.[0-9a-f]{12})-(?P<what>[0-9a-f]{12})(?P<suffix>\..+)")


def drop_stale(npy: Path) -> None:
    """Remove the entries with ``npy``'s path and suffix but an older file identity (the file changed)."""
    me = _KEYED.fullmatch(npy.name)
    if me is None:
        return
    stem = me["suffix"][: -len(".npy")] if me["suffix"].endswith(".npy") else me["suffix"]
    for old in npy.parent.glob(f"{glob.escape(me['head'])}-*"):
        other = _KEYED.fullmatch(old.name)
        if other and other["what"] != me["what"] and other["suffix"] in (stem + ".npy", stem + ".json"):
            old.unlink(missing_ok=True)


def open_mmap(path: str | os.PathLike) -> np.ndarray:
    """The file's bytes as a read-only uint8 array (an empty array for an empty file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL file not found: {str(path)!r}")
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=np.uint8)


LF, CR = 10, 13


class _FileBytes:
    """The bytes of a file as far as :func:`scan_line_ends` needs them (length, slices, one
    byte), read with ``os.pread``: a file cut short under the scan is a ConfigError, not a SIGBUS."""

    def __init__(self, path: Path) -> None:
        self.path, self.size = path, os.stat(path).st_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: int | slice) -> np.ndarray | int:
        lo, hi, _ = (key if isinstance(key, slice) else slice(key % self.size, key % self.size + 1)).indices(self.size)
        with open(self.path, "rb", buffering=0) as f:
            got = os.pread(f.fileno(), hi - lo, lo) if hi > lo else b""
        if len(got) != max(0, hi - lo):
            raise file_changed_error(
                self.path,
                f"{self.size} bytes when the scan began, fewer at byte {lo + len(got)}",
                "its line index scan",
            )
        array = np.frombuffer(got, dtype=np.uint8)
        return array if isinstance(key, slice) else int(array[0])


def _scan(data: np.ndarray, byte: int, chunk_bytes: int) -> np.ndarray:
    parts = [
        np.flatnonzero(data[start : start + chunk_bytes] == byte) + start for start in range(0, len(data), chunk_bytes)
    ]
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)


def scan_line_ends(data: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    """int64 end offset of every line in ``data`` (uint8); a final line without a terminator ends at ``len``.

    Lines end at ``\\n`` (a ``\\r`` before it stays in the line: JSON ignores it as whitespace).
    A file with no ``\\n`` but with ``\\r`` has old Mac (CR-only) line endings: its lines end at
    each ``\\r``, so the user gets their lines rather than one giant broken record.
    """
    terminator = LF
    ends = _scan(data, LF, chunk_bytes)
    if len(ends) == 0 and len(data):
        cr = _scan(data, CR, chunk_bytes)
        if len(cr):
            terminator, ends = CR, cr
    if len(data) and data[-1] != terminator:
        ends = np.append(ends, len(data))
    return ends


def save_cached(array: np.ndarray, npy: Path, meta: dict) -> bool:
    """Write ``array`` + its JSON meta atomically; False (with a warning) when the place is not writable."""
    try:
        npy.parent.mkdir(parents=True, exist_ok=True)
        tmp = npy.with_name(npy.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, npy)
        info = npy.with_suffix(".json")
        tmp_info = info.with_name(info.name + f".tmp{os.getpid()}")
        tmp_info.write_text(json.dumps(meta))
        os.replace(tmp_info, info)
        drop_stale(npy)
        return True
    except OSError as exc:
        warnings.warn(f"cannot write cache {str(npy)!r} ({exc}); keeping it in memory only", stacklevel=3)
        return False


def load_cached(npy: Path, meta: dict, expected_len: int | None = None) -> tuple[np.ndarray, dict] | None:
    """(array, stored meta) when the stored meta agrees with ``meta`` on its keys and the array is
    intact; None means rebuild (missing, stale, truncated or corrupt)."""
    info = npy.with_suffix(".json")
    try:
        stored = json.loads(info.read_text())
        if not isinstance(stored, dict) or {k: stored.get(k) for k in meta} != meta:
            return None
        array = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, json.JSONDecodeError):
        return None
    if array.ndim != 1 or (expected_len is not None and len(array) != expected_len):
        return None
    return array, stored


def load_line_index(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """Line ends of ``path``: the cached index (:func:`cache_path`) when its fingerprint matches, else a fresh scan."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"JSONL file not found: {str(path)!r}")
    data = _FileBytes(Path(path))
    meta = {"version": INDEX_VERSION, "kind": "line_ends", "source": file_fingerprint(path)}
    npy = cache_path(path, ".idx.npy", cache_dir)
    cached = load_cached(npy, meta)
    n = len(data)
    # the last end is the final terminator, or the file size (a final \r may be either)
    expected_last = {n - 1} if n and data[-1] == LF else {n - 1, n} if n and data[-1] == CR else {n}
    if cached is not None and (int(cached[0][-1]) in expected_last if len(cached[0]) else n == 0):
        return cached[0]
    ends = scan_line_ends(data)
    save_cached(ends, npy, meta)
    return ends


def file_identity(path: str | os.PathLike) -> tuple[int, int, int]:
    """(size, mtime_ns, inode) of ``path``: what a rewrite, an append or a truncation changes."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def file_changed_error(path: str | os.PathLike, what: str, during: str = "the length pass") -> ConfigError:
    """The error for a JSONL file that changed while it was being read."""
    return ConfigError(
        "path",
        f"{str(path)!r} changed during {during} ({what})",
        "rerun when the file is stable (let the writer finish, or copy the file first)",
    )


class LineIndex:
    """Random access to the raw bytes of line ``i`` of a JSONL file (cached line index; lines are
    read with ``os.pread``, so a file truncated under us is an error, never a SIGBUS).

    Pickles without the mmap and the file descriptor (DataLoader workers reopen them lazily).
    """

    def __init__(self, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.cache_dir = cache_dir
        self.identity = file_identity(self.path)  # before the scan: a change after it shows in the pass
        self.ends = np.asarray(load_line_index(self.path, cache_dir))
        self._data: np.ndarray | None = None
        self._fd: int | None = None
        self._fd_pid = 0

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = open_mmap(self.path)
        return self._data

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of the file; ConfigError when the file is now shorter (it changed)."""
        if hi <= lo:
            return b""
        if self._fd is None or self._fd_pid != os.getpid():
            self._fd, self._fd_pid = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), os.getpid()
        parts, pos = [], lo
        while pos < hi:
            got = os.pread(self._fd, hi - pos, pos)
            if not got:
                raise file_changed_error(
                    self.path, f"it ends before byte {hi} that the line index expects; read stopped at byte {pos}"
                )
            parts.append(got)
            pos += len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def line(self, i: int) -> bytes:
        """Raw bytes of line ``i`` (0-based), without the newline."""
        start = int(self.ends[i - 1]) + 1 if i > 0 else 0
        return self.read(start, int(self.ends[i]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None, "_fd": None, "_fd_pid": 0}

    def __del__(self) -> None:
        fd = self.__dict__.get("_fd")
        if fd is not None and self.__dict__.get("_fd_pid") == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass
