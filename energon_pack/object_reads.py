"""How loader workers read shards from object storage: MSC's whole-object limit and a read-ahead for
its range reads, as one knob.

multi-storage-client (1.3) opens an object for reading in one of two ways. Up to its
``memory_load_limit`` (512 MiB) it downloads the whole object into the process's memory; Energon
keeps up to 5 shards open per worker, so that is up to 5 x 512 MiB per worker. Above the limit
every ``read()`` is one ranged GET, and Energon's tar reader reads a sample as several small reads
(a 512-byte header, then each member): about 9 requests per sample (8.9 measured on the demo
shards, ``scripts/bench_object_storage.py``). :func:`configure_object_reads` sets the limit for
shards (``.tar`` objects) and puts a read-ahead buffer in front of the range reader, so one ranged
request brings a sample's members and its neighbours (0.12 requests per sample at 1 MiB, as few as
whole-shard reads, with a worker's memory bounded by the buffer).

It changes two methods of MSC's ``ObjectFile`` in this process; loader workers forked afterwards
(Energon's default on Linux) inherit it, so call it before building the loader.
"""

from __future__ import annotations

import inspect
import io
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.object_waits import msc_missing

#: a read-ahead that brings about a hundred demo samples per request (their mean is ~11 KB)
DEFAULT_READ_AHEAD = 1 << 20

_ORIGINAL: dict[str, Any] = {}


def configure_object_reads(*, whole_object_limit: int | None = None, read_ahead: int = 0) -> None:
    """Shards of at most ``whole_object_limit`` bytes are downloaded whole, larger ones range-read
    (None: MSC's own 512 MiB); each range read asks for at least ``read_ahead`` bytes (0: MSC's own,
    one request per read). ``configure_object_reads()`` restores MSC's behaviour.

    Call it before the loader is built: forked loader workers inherit it.

    Args:
        whole_object_limit: the largest shard (``.tar`` object), in bytes, that is downloaded whole into
            the worker's memory; larger shards are range-read. Other objects (indexes, metadata) keep MSC's
            limit. Default None: MSC's own limit (512 MiB), i.e. MSC's behaviour; e.g. ``64 << 20`` keeps
            a worker's memory bounded when shards are large.
        read_ahead: the least bytes each range read asks for (a read-ahead buffer in front of
            MSC's range reader), so one request brings a sample's members and its neighbours. Default 0: no
            buffer, MSC's own one request per ``read()`` (about 9 per sample);
            :data:`DEFAULT_READ_AHEAD` (1 MiB) measured 0.12 requests per sample.
    """
    for knob, value in (("whole_object_limit", whole_object_limit), ("read_ahead", read_ahead)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(
                knob,
                f"must be a whole number of bytes >= 0, got {value!r}",
                "pass e.g. whole_object_limit=64 << 20, read_ahead=1 << 20",
            )
    cls = _object_file_class()
    init, open_large = _ORIGINAL["__init__"], _ORIGINAL["_open_large_file"]

    def limited_init(self: Any, *args: Any, **kw: Any) -> None:
        if str(kw.get("remote_path", "")).endswith(".tar"):
            kw["memory_load_limit"] = whole_object_limit
        init(self, *args, **kw)

    def buffered_open_large_file(self: Any) -> None:
        open_large(self)
        self._file = io.BufferedReader(self._file, buffer_size=read_ahead)

    cls.__init__ = init if whole_object_limit is None else limited_init
    cls._open_large_file = buffered_open_large_file if read_ahead else open_large


def _object_file_class() -> type:
    """MSC's ``ObjectFile``, its original methods kept once; a ConfigError for a release that reads otherwise."""
    try:
        from multistorageclient.file import ObjectFile
    except ImportError as exc:
        raise msc_missing(exc) from None
    if not _ORIGINAL:
        if "memory_load_limit" not in inspect.signature(ObjectFile.__init__).parameters or not hasattr(
            ObjectFile, "_open_large_file"
        ):
            raise ConfigError(
                "object storage",
                "this multi-storage-client release opens objects differently from "
                "1.3 (no memory_load_limit / _open_large_file)",
                "leave configure_object_reads out, or install multi-storage-client 1.3",
            )
        _ORIGINAL.update(__init__=ObjectFile.__init__, _open_large_file=ObjectFile._open_large_file)
    return ObjectFile
