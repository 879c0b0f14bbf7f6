"""An output folder that is whole or absent: one writer at a time, every file staged, swapped in at once.

``pack-offline`` writes two files Bridge reads together (the packs Parquet and the packing metadata). Written in
place, a second run or a kill between the two leaves a Parquet of one run beside the metadata of another, which
Bridge would train on. :func:`staged_output` holds an exclusive lock beside the folder, gives the caller a staging
folder (beside it, so on the same file system) holding hard links of the folder's current files, and on success
exchanges the two folders in one atomic ``renameat2(RENAME_EXCHANGE)`` (Linux) or, where that is missing, two
renames that the next run completes or undoes. A failure or a kill leaves the old folder as it was; a killed run's
staging folder is removed by the next run.

The folder is the real one: a symlinked output path is resolved first (the link keeps pointing at it, the swap
happens beside its target, on the target's file system). A mount point cannot be renamed, so it is refused before
any work (write into a folder inside it). The lock records its holder (:mod:`energon_pack.processes`): workers die
with the run, SIGTERM ends the run through its ``finally`` blocks, and a lock held only by a killed run's orphans
is taken over.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from energon_pack.errors import ConfigError
from energon_pack.processes import holder_note, lock, sigterm_exits, unlock

__all__ = ["staged_output"]

_STAGING = ".staging-"
_OLD = ".old-"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


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


def _mount_points() -> set[str]:
    """Every mount point of this process (``/proc/self/mountinfo``; bind mounts of one file system included)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    unescape = re.compile(r"\\([0-7]{3})")
    return {unescape.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in lines if len(line.split()) > 4}


def _refuse_mount_point(out: Path, reason: str = "is a mount point") -> ConfigError:
    return ConfigError(
        "out",
        f"{out} {reason}; the output folder is replaced as a whole (staged beside it, then renamed), which a mount "
        "point does not allow",
        f"write the packs to a folder inside it (e.g. {out / 'packs'})",
    )


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


def _no_space(out: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        "out",
        f"no space left on the device of {out}{f' (writing {exc.filename})' if exc.filename else ''}; the old output "
        "is kept",
        f"free space on the disk of {out.parent} or write the packs to a folder on a larger disk (the run needs "
        "about 4 bytes a token for the token file plus the packs, until it ends)",
    )


@contextmanager
def staged_output(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Lock ``out_dir``, yield a staging folder with its current files, swap it in when the block succeeds.

    Replace or add files in the staging folder by writing new files (never write into a linked file: it is the
    old folder's too). A second writer gets a ConfigError at once (a lock held only by a killed run's orphaned
    workers is taken over, with a :class:`~energon_pack.processes.StaleLockWarning`); on an exception, SIGTERM
    included, nothing at ``out_dir`` changes. A full disk is a ConfigError naming the folder.
    """
    out = Path(os.path.realpath(out_dir))
    if out == Path.cwd().absolute() or out in Path.cwd().absolute().parents or out.parent == out:
        raise ConfigError(
            "out",
            f"{out} is the current folder or above it; the output folder is replaced as a whole",
            "write the packs to a folder of their own (e.g. packs/)",
        )
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} is a file, not a folder", "choose a folder for the packs")
    if out.is_dir() and (os.path.ismount(out) or str(out) in _mount_points()):
        raise _refuse_mount_point(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = _hidden(out, ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not lock(fd, lock_path):
            raise ConfigError(
                "out",
                f"another run is writing {out} (it holds {lock_path.name})",
                "wait for it to finish, or write to another output folder",
            )
        with contextlib.suppress(OSError):  # who holds it: a later run can tell when it is gone
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{holder_note()}\n".encode(), 0)
        with sigterm_exits():
            _recover(out)
            stage = Path(str(_hidden(out, _STAGING)) + f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                stage.mkdir()
                if out.exists():
                    _link_files(out, stage)
                yield stage
                _swap_in(stage, out)
            except OSError as exc:
                if exc.errno in _NO_SPACE:
                    raise _no_space(out, exc) from None
                if exc.errno in (errno.EBUSY, errno.EXDEV):  # a mount point the checks above did not see
                    raise _refuse_mount_point(out, f"cannot be renamed ({exc.strerror})") from None
                raise
            finally:
                shutil.rmtree(stage, ignore_errors=True)
    finally:
        unlock(fd)  # the lock file stays: removing it would race with a run opening it
