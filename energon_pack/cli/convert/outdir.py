"""The output folder's rules: one convert at a time (an ``flock`` on the folder; its holder noted in
:data:`IN_PROGRESS_FILE`, so a lock left to a killed run's orphaned workers is taken over), a manifest of every name
a run writes, and ``--overwrite`` deleting exactly those names, never a folder convert did not write. Convert writes
inside the folder (never renames it), so a mount point or a symlinked folder works as any other."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from energon_pack.errors import ConfigError
from energon_pack.processes import holder_note, lock, sigterm_exits, unlock

SUMMARY_FILE = "convert_summary.json"
IN_PROGRESS_FILE = ".convert_in_progress"
TMP_DIR = ".convert_tmp"
MANIFEST_FILE = ".convert_manifest.json"  # every top-level name convert wrote: all --overwrite ever deletes
_OWN_DIRS = (TMP_DIR, ".nv-meta")
_FIXED = (MANIFEST_FILE, IN_PROGRESS_FILE, SUMMARY_FILE, *_OWN_DIRS)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_ENERGON_SUFFIXES = (".idx", ".idx.tmp")  # Energon's per-shard index, and its temporary name while indexing


def _lock_out_dir(out: Path) -> int:
    """Create ``out`` if needed and hold an exclusive ``flock`` on it (released by
    :func:`energon_pack.processes.unlock` or when the process dies; forked workers close their copy and die with
    it, so a killed run leaves no stale lock); ConfigError when another convert holds it."""
    if out.exists() and not out.is_dir():
        raise ConfigError("out_dir", f"{out} is a file", "pass a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    if not lock(fd, out / IN_PROGRESS_FILE):
        os.close(fd)
        raise ConfigError(
            "out_dir",
            f"another energon-pack convert is writing to {out}",
            "wait for it to finish, or choose another folder",
        )
    return fd


@contextlib.contextmanager
def _locked_out_dir(out: Path) -> Iterator[None]:
    """The block runs holding ``out``'s lock (:func:`_lock_out_dir`), SIGTERM raising SystemExit; on a failure the
    partial tars are removed (the folder then holds an interrupted conversion) and a full disk is a ConfigError
    naming the folder."""
    fd = _lock_out_dir(out)
    try:
        with sigterm_exits():
            yield
    except BaseException as exc:
        with contextlib.suppress(OSError):
            if holder_note() in (out / IN_PROGRESS_FILE).read_text():  # this run prepared the folder: the tmp is ours
                shutil.rmtree(out / TMP_DIR, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            raise _cannot_write(out, exc) from None
        raise
    finally:
        unlock(fd)


def _cannot_write(out: Path, exc: OSError) -> ConfigError:
    if exc.errno in NO_SPACE:
        return ConfigError(
            "out_dir",
            f"no space left on the device of {out} (writing {exc.filename or out})",
            f"free space on the disk of {out}, or choose a folder on a larger disk; then pass --overwrite to start "
            "over",
        )
    return ConfigError("out_dir", f"cannot write to {out}: {exc.strerror or exc}", "choose a writable folder")


def _write_manifest(out: Path, names: list) -> None:
    """Record (atomically) the top-level names this run writes, before it writes them."""
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"written_by": "energon-pack convert", "names": sorted(set(names) | set(_FIXED))}) + "\n")
    os.replace(tmp, out / MANIFEST_FILE)


def _owned_names(out: Path) -> set | None:
    """The names a previous convert listed in its manifest (plus Energon's files for its shards); None without one."""
    try:
        names = set(json.loads((out / MANIFEST_FILE).read_text())["names"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    shards = [n for n in names if n.endswith(".tar")]
    return names | {MANIFEST_FILE, MANIFEST_FILE + ".tmp"} | {s + x for s in shards for x in _ENERGON_SUFFIXES}


def _prepare_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse a folder convert did not write; with ``overwrite``, delete exactly what a previous run listed."""
    entries = list(out.iterdir())
    if entries:
        owned = _owned_names(out)
        foreign = sorted(
            p.name
            for p in entries
            if owned is None or p.name not in owned or (p.is_dir() and not p.is_symlink() and p.name not in _OWN_DIRS)
        )
        if foreign:
            raise ConfigError(
                "out_dir",
                f"{out} is not empty and not an energon-pack convert output (it holds "
                f"{', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''})",
                f"choose a new or empty folder (convert deletes only what its manifest {MANIFEST_FILE} lists)",
            )
        if not overwrite:
            if (out / SUMMARY_FILE).exists():
                try:
                    done = json.loads((out / SUMMARY_FILE).read_text())
                    what = f"{done['written']} samples from {done['source']}"
                except (OSError, ValueError, KeyError):
                    what = "a finished conversion"
                raise ConfigError(
                    "out_dir",
                    f"{out} already holds a finished conversion ({what})",
                    "pass --overwrite (overwrite=True) to convert again, or choose another folder",
                )
            raise ConfigError(
                "out_dir",
                f"{out} holds an interrupted conversion",
                "pass --overwrite (overwrite=True) to start over, or choose another folder",
            )
        for p in sorted(entries, key=lambda p: p.name == MANIFEST_FILE):  # the manifest last
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    try:
        _write_manifest(out, [])
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        (out / IN_PROGRESS_FILE).write_text(f"energon-pack convert started {started} by {holder_note()}\n")
        (out / TMP_DIR).mkdir()
    except OSError as exc:
        raise _cannot_write(out, exc) from None
