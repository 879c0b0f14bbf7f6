"""Local and object-storage paths, one abstraction: Energon's ``EPath``.

Energon reads ``msc://PROFILE/bucket/prefix`` paths through NVIDIA's multi-storage-client (MSC);
``pathlib.Path`` would turn ``msc://`` into ``msc:/`` (a local folder of that name). Everything of
ours that takes a dataset path goes through here: :func:`is_remote` to tell the two apart,
:func:`epath` to reach either one, :func:`file_size` (one HEAD) and :func:`read_range` (one ranged
GET) for what the shard check needs, :func:`list_names` for what a prefix holds, :func:`upload_tree`
for ``convert``'s output, and :func:`store_errors` to turn a failed request into one line. Many
small requests go out on :data:`REQUEST_THREADS` threads: object stores answer many at once, not
fast one by one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from energon_pack.errors import ConfigError

#: threads that send HEAD / ranged GET requests at once (a remote check of many shards)
REQUEST_THREADS = 16


def is_remote(path: Any) -> bool:
    """Whether ``path`` names object storage (``msc://...``, a ``scheme://`` other than ``file://``)."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def epath(path: Any) -> Any:
    """``path`` as Energon's ``EPath``; an MSC profile or config problem is a one-line ConfigError. A remote path
    gets the default bounded waits first (:func:`~energon_pack.object_waits.install_default_object_waits`)."""
    from megatron.energon.epathlib import EPath

    if not is_remote(path):
        return EPath(Path(path))
    from energon_pack.object_waits import install_default_object_waits

    install_default_object_waits()  # before the first client of a profile is made: it keeps its timeouts
    try:
        return EPath(str(path))
    except ImportError as exc:
        raise ConfigError(
            "path",
            f"{path}: reading object storage needs a package that is not installed ({exc})",
            "pip install 'energon-pack[s3]' (multi-storage-client with boto3)",
        ) from None
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ConfigError(
            "path",
            f"{path}: the MSC profile could not be set up ({' '.join(str(exc).split())})",
            "check the profile name and the MSC config ($MSC_CONFIG or ~/.msc_config.yaml; "
            "docs/guides/object_storage.md)",
        ) from None


@contextlib.contextmanager
def store_errors(url: Any) -> Iterator[None]:
    """A failed request to the store (endpoint, credentials, bucket: MSC raises RuntimeError, boto
    its own errors) as one ConfigError naming ``url``; a missing object stays FileNotFoundError."""
    try:
        yield
    except (ConfigError, FileNotFoundError):
        raise
    except Exception as exc:
        raise ConfigError(
            "object storage",
            f"a request for {url} failed ({type(exc).__name__}: {' '.join(str(exc).split())})",
            "check the MSC profile's endpoint, bucket and credentials (docs/guides/object_storage.md)",
        ) from None


def file_size(path: Any) -> int | None:
    """The size in bytes of a local file or an object (one HEAD); None when it does not exist."""
    try:
        return os.stat(path).st_size if not is_remote(path) else epath(path).size()
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_range(path: Any, offset: int, size: int) -> bytes:
    """``size`` bytes of a file or object from ``offset`` (one ranged GET remotely); fewer at its end."""
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    from multistorageclient.types import Range

    p = epath(path)
    return p.fs.read(p._internal_str_path, byte_range=Range(offset=offset, size=size))


def list_names(path: Any) -> list[str]:
    """The files under the folder or prefix ``path``, as sorted ``/``-separated names relative to it
    (one paginated listing remotely; an object store has no empty folders: nothing there is ``[]``)."""
    if not is_remote(path):
        root = Path(path)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    p = epath(path)
    prefix = p._internal_str_path.strip("/") + "/"
    return sorted(
        o.key.lstrip("/")[len(prefix) :] for o in p.fs.list_recursive(prefix) if o.key.lstrip("/").startswith(prefix)
    )


def upload_tree(folder: str | Path, target: str) -> int:
    """Copy every file under the local ``folder`` to the prefix ``target`` (``msc://...``), on
    :data:`REQUEST_THREADS` threads; returns the number of files."""
    folder, dest = Path(folder), epath(target)
    names = list_names(folder)

    def put(name: str) -> None:
        (dest / name).fs.upload_file((dest / name)._internal_str_path, str(folder / name))

    with ThreadPoolExecutor(min(REQUEST_THREADS, max(1, len(names)))) as pool:
        list(pool.map(put, names))
    return len(names)
