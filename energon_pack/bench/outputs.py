"""Where a benchmark command's files go: the files of one run, announced, never clobbering an earlier run.

Every command that writes reports (``demo``, ``bench``, ``bench-packing``, ``bench-pixels``,
``bench-sft``, ``bench-offline``) declares the names it may write in one folder (its ``--out`` /
``--out-dir``) as a :class:`RunFiles`. The folder is created at the first write only (a run that fails
before writing leaves nothing behind). At that first write, an earlier run's files of the same set are
moved aside with the earlier run's time in their names (``demo.json`` -> ``demo.20261203-091502.json``)
and one line says so: the newest run is always at the plain name, and no run's result is lost. A run
rewrites its own files freely (``bench`` rewrites its JSON after every cell). Two runs writing into one
folder at the same moment are not told apart: give each its own folder.

It lives with the benchmarks (not in ``energon_pack.cli``) because the benchmarks write the files and
may not import the command layer above them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the ``--out`` help of the commands that write one JSON report
OUT_HELP = "JSON report path (an earlier run's file there is kept, renamed with its time)"


def shown(path: Path) -> str:
    """``path`` as a message shows it: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class RunFiles:
    """The files one run may write into ``folder`` (``names``): see the module docstring."""

    def __init__(self, folder: str | Path, names: Sequence[str]) -> None:
        self.folder = Path(folder)
        self.names = tuple(names)
        self.written: list[Path] = []
        self._claimed = False

    @classmethod
    def for_file(cls, out: str | Path) -> tuple[RunFiles, str]:
        """(the run's files, the name) for a command that writes the one file ``out`` (``--out``)."""
        out = Path(out)
        return cls(out.parent, [out.name]), out.name

    def path(self, name: str) -> Path:
        """The path of ``name`` (one of :attr:`names`), after the first-write steps (folder, earlier run)."""
        if name not in self.names:
            raise ValueError(f"{name!r} is not one of this run's files {self.names}")
        if not self._claimed:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._move_earlier_run_aside()
            self._claimed = True
        path = self.folder / name
        if path not in self.written:
            self.written.append(path)
        return path

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` whole or not at all (a temporary file, then renamed)."""
        path = self.path(name)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return path

    def write_json(self, name: str, value: Any) -> Path:
        return self.write_text(name, json.dumps(value, indent=2))

    def announce(self) -> str:
        """``wrote FOLDER/a.json, b.md`` for the files written so far (print it when the run ends)."""
        if not self.written:
            return "wrote nothing"
        first, *rest = self.written
        return "wrote " + ", ".join([shown(first), *(p.name for p in rest)])

    def _move_earlier_run_aside(self) -> None:
        earlier = [self.folder / n for n in self.names if (self.folder / n).exists()]
        if not earlier:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(os.path.getmtime(p) for p in earlier)))
        n = 1
        while any(_stamped(p, stamp, n).exists() for p in earlier):
            n += 1
        for p in earlier:
            p.rename(_stamped(p, stamp, n))
        kept = _stamped(earlier[0], stamp, n).name
        what = f"its {len(earlier)} files" if len(earlier) > 1 else "it"
        print(
            f"{shown(self.folder)}/ held an earlier run's {earlier[0].name}"
            + (f" (and {len(earlier) - 1} more)" if len(earlier) > 1 else "")
            + f": kept {what} with the earlier run's time in the name ({kept})",
            flush=True,
        )


def write_report(out: str | Path, value: Any) -> str:
    """Write the JSON report ``out`` of a one-file command (``--out``) as a :class:`RunFiles`; return
    the line that announces it."""
    files, name = RunFiles.for_file(out)
    files.write_json(name, value)
    return files.announce()


def _stamped(path: Path, stamp: str, n: int) -> Path:
    """``demo.json`` -> ``demo.STAMP.json`` (``demo.STAMP-N.json`` when that is taken)."""
    tag = stamp if n == 1 else f"{stamp}-{n}"
    return path.with_name(f"{path.stem}.{tag}{path.suffix}")
