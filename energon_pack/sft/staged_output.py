"""An output folder that is whole or absent: one writer at a time, every file staged, swapped in at once.

``pack-offline`` writes two files Bridge reads together (the packs Parquet and the packing metadata). Written in
place, a second run or a kill between the two leaves a Parquet of one run beside the metadata of another, which
Bridge would train on. :func:`staged_output` holds an exclusive lock beside the folder, gives the caller a staging
folder (beside it, so on the same file system) holding hard links of the folder's current files, and on success
exchanges the two folders in one atomic ``renameat2(RENAME_EXCHANGE)`` (Linux) or, where that is missing, two
renames that the next run completes or undoes. A failure or a kill leaves the old folder as it was; a killed run's
staging folder is removed by the next run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from energon_pack.errors import ConfigError

__all__ = ["staged_output"]

_STAGING = ".staging-"
_OLD = ".old-"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _hidden(out: Path, kind: str) -> Path:
    return out.parent / f".{out.name}{kind}"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where the call or the file system lacks it."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def _swap_in(stage: Path, out: Path) -> None:
    """Make ``stage`` the folder at ``out``; afterwards ``stage`` holds the old folder (if there was one)."""
    if not out.exists():
        os.rename(stage, out)
        return
    if _exchange(stage, out):
        return
    old = Path(str(_hidden(out, _OLD)) + uuid.uuid4().hex[:8])
    os.rename(out, old)  # a kill here: the next run puts the old folder back (_recover)
    os.rename(stage, out)
    os.rename(old, stage)


def _recover(out: Path) -> None:
    """Finish what a killed run left: restore an old folder moved aside, remove staging folders."""
    for leftover in sorted(out.parent.glob(f".{out.name}{_OLD}*")):
        if out.exists():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            os.rename(leftover, out)
    for leftover in out.parent.glob(f".{out.name}{_STAGING}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _link_files(src: Path, dst: Path) -> None:
    """Hard-link (or copy) the files of ``src`` into ``dst``; a sub-folder is refused (not ours to carry)."""
    for entry in src.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            raise ConfigError(
                "out",
                f"{src} holds the folder {entry.name}; the output folder is replaced as a whole, so it must hold "
                "only files",
                "write the packs to a folder of their own (e.g. OUT/packs)",
            )
        try:
            os.link(entry, dst / entry.name, follow_symlinks=False)
        except OSError:
            shutil.copy2(entry, dst / entry.name, follow_symlinks=False)


@contextmanager
def staged_output(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Lock ``out_dir``, yield a staging folder with its current files, swap it in when the block succeeds.

    Replace or add files in the staging folder by writing new files (never write into a linked file: it is the
    old folder's too). A second writer gets a ConfigError at once; on an exception nothing at ``out_dir`` changes.
    """
    out = Path(out_dir).absolute()
    if out == Path.cwd().absolute() or out in Path.cwd().absolute().parents or out.parent == out:
        raise ConfigError(
            "out",
            f"{out} is the current folder or above it; the output folder is replaced as a whole",
            "write the packs to a folder of their own (e.g. packs/)",
        )
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} is a file, not a folder", "choose a folder for the packs")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(_hidden(out, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                "out",
                f"another run is writing {out} (it holds {_hidden(out, '.lock').name})",
                "wait for it to finish, or write to another output folder",
            ) from None
        _recover(out)
        stage = Path(str(_hidden(out, _STAGING)) + f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        stage.mkdir()
        try:
            if out.exists():
                _link_files(out, stage)
            yield stage
            _swap_in(stage, out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        os.close(lock)  # the lock file stays (empty): removing it would race with a run opening it
