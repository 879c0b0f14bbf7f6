"""How library errors and warnings read on the command line: one line each, knobs named by the
command's flags (``seq_length`` -> ``--width``), the next step where we know it.

Library errors carry data (``ConfigError.knob``, the :class:`~energon_pack.errors.Hint` objects of
``AllSkippedError`` and ``SkipRateWarning``); each command gives its ``KNOB_FLAGS`` and this module
renders them: a hint whose knob the command has no flag for is left out. Knob names inside free
text (a ConfigError's problem and fix) are mapped to flags at word boundaries.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from .common import CliError


def name_flags(text: str, flags: Mapping[str, str]) -> str:
    """``text`` with each knob of ``flags`` named by its flag (whole identifiers only; ``width`` only
    where it is named as a knob: ``width:``, ``width=``, ``width >=``; ``knob=True`` is the bare switch)."""
    for knob, flag in flags.items():
        text = re.sub(rf"(?<![\w-]){re.escape(knob)}=True\b", flag, text)  # a switch: --overwrite, not =True
        after = r"(?=\s*(?::|=|>=))" if knob == "width" else r"(?![\w-])"
        text = re.sub(rf"(?<![\w-]){re.escape(knob)}{after}", flag, text)
    return text


#: how torch marks an error re-raised from a DataLoader worker ("Caught X in DataLoader worker process N.")
_WORKER_TRACEBACK = "Original Traceback (most recent call last):"
#: a traceback's last line for one of our errors: ``energon_pack.module.ClassName: message``
_OUR_ERROR_LINE = re.compile(r"^(energon_pack(?:\.\w+)*)\.(\w+): (.*)$")


def worker_user_error(exc: BaseException) -> tuple[type, str] | None:
    """For an error re-raised from a DataLoader worker whose chain holds one of our user errors (a
    ConfigError, an AllSkippedError: possibly wrapped, e.g. in MSC's OSError, or turned into a
    RuntimeError by torch), that error's class and message; None otherwise."""
    from energon_pack.errors import AllSkippedError, ConfigError

    text = str(exc)
    if _WORKER_TRACEBACK not in text:
        return None
    for line in text.splitlines():  # causes come first in a chained traceback: the first of ours is the cause
        match = _OUR_ERROR_LINE.match(line)
        if not match:
            continue
        module = sys.modules.get(match.group(1))
        cls = getattr(module, match.group(2), None) if module is not None else None
        if isinstance(cls, type) and issubclass(cls, (ConfigError, AllSkippedError)):
            return cls, match.group(3)
    return None


def reported(exc: BaseException) -> BaseException:
    """The error to report for ``exc``: the first of our user errors (ConfigError, AllSkippedError) in
    its chain of causes, which a wrapper would hide (MSC raises OSError from a failed download), else
    ``exc``."""
    from energon_pack.errors import AllSkippedError, ConfigError

    seen: BaseException | None = exc
    for _ in range(32):
        if seen is None:
            break
        if isinstance(seen, (ConfigError, AllSkippedError)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def original_message(exc: BaseException) -> str:
    """The message of ``exc``; for an error re-raised from a DataLoader worker (torch wraps it as
    "Caught X in DataLoader worker process N. Original Traceback ..."), the worker's own message:
    ours where one of our user errors is in its chain, else the re-raised error's."""
    text = str(exc)
    if _WORKER_TRACEBACK not in text:
        return text
    ours = worker_user_error(exc)
    if ours is not None:
        return ours[1]
    name = type(exc).__name__
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        head, sep, rest = lines[i].partition(": ")
        if sep and (head == name or head.endswith("." + name)):
            return "\n".join([rest, *lines[i + 1 :]])
    return lines[-1]


def message(exc: BaseException, flags: Mapping[str, str] | None) -> str:
    """``exc``'s message with the command's flags: a skip report rendered from its hints, a
    ConfigError's knob as its flag, any other message with knob names mapped (``flags`` None:
    the library's own wording)."""
    from energon_pack.errors import AllSkippedError, ConfigError, SkipRateWarning

    if flags is None:
        return original_message(exc)
    if isinstance(exc, (AllSkippedError, SkipRateWarning)) and exc.skips is not None:
        return name_flags(exc.render(flags), flags)
    if isinstance(exc, ConfigError) and hasattr(exc, "problem"):
        return f"{flags.get(exc.knob, exc.knob)}: {name_flags(exc.problem, flags)}. Fix: {name_flags(exc.fix, flags)}"
    return name_flags(original_message(exc), flags)


def one_line(exc: BaseException, flags: Mapping[str, str] | None = None) -> str:
    """A user-facing line for ``exc``, with the next step where we know it."""
    exc = reported(exc)
    text = " ".join(message(exc, flags).split()) or type(exc).__name__
    if text.startswith("Invalid dataset at"):
        return (
            f"{text}: not a prepared Energon dataset: run `energon-pack prepare DIR` for *.tar shards or "
            f"`energon-pack convert SOURCE OUT` for JSON/JSONL/Parquet data"
        )
    if text.startswith("No shards found in split part"):
        return (
            f"{text}: the dataset's split gives this part no shard: re-run `energon-pack prepare DIR --split "
            f"TRAIN,VAL,TEST` (ratios of whole shards)"
        )
    from energon_pack.errors import AllSkippedError, ConfigError

    if isinstance(exc, (CliError, ConfigError, AllSkippedError)) or worker_user_error(exc) is not None:
        return text
    return f"{type(exc).__name__}: {text} (run again with --debug for the traceback)"


def exit_status(exc: BaseException) -> int:
    """2 for a user error (a bad path, number, configuration or dataset), 1 for a bug."""
    from energon_pack.errors import AllSkippedError, ConfigError

    exc = reported(exc)
    user_error = isinstance(exc, (CliError, ConfigError, AllSkippedError, FileNotFoundError, ValueError, OSError))
    user_error = user_error or worker_user_error(exc) is not None
    return 2 if user_error or type(exc).__name__ == "EmptyDatasetError" else 1


@contextlib.contextmanager
def one_line_warnings(prog: str, flags: Mapping[str, str]) -> Iterator[None]:
    """Library warnings as one line each (``PROG: warning: ...``, the command's flags for Python
    knobs), also in forked loader workers; skip reports built there name the flags too
    (:func:`~energon_pack.errors.knob_names`). The package logger's copy of the same message is
    not printed a second time."""
    import logging
    import warnings

    from energon_pack.errors import knob_names

    def show(msg: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        text = message(msg, flags) if isinstance(msg, Warning) else name_flags(str(msg), flags)
        print(f"{prog}: warning: {' '.join(text.split())}", file=sys.stderr, flush=True)

    logger, quiet, saved = logging.getLogger("energon_pack"), logging.NullHandler(), warnings.showwarning
    logger.addHandler(quiet)
    warnings.showwarning = show
    try:
        with knob_names(flags):
            yield
    finally:
        warnings.showwarning = saved
        logger.removeHandler(quiet)
