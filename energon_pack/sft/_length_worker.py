"""A length-pass worker in a fresh interpreter (see :func:`energon_pack.sft.length_pass._fresh_worker_results`).

Started as ``python -c "from energon_pack.sft._length_worker import main; main(<in fd>, <out fd>)"``
with glibc's per-thread malloc cache enlarged (``GLIBC_TUNABLES``): the tokenizer allocates
and frees a few small objects per token, and a larger tcache makes that ~9% cheaper. A fresh
interpreter, not a ``spawn`` process, so the user's ``__main__`` is never re-imported.

Protocol over two pipes (``multiprocessing.connection`` framing): receive the pickled dataset,
answer ``("ready", None)`` (or ``("setup_error", text)``); then per task ``(start, stop, batch)``
answer ``("ok", result)`` or ``("raise", exception)``; ``None`` ends the worker. Forked workers
(:func:`energon_pack.sft.length_pass._fork_worker`) run the same loop (:func:`serve`).
"""

from __future__ import annotations

import os
import pickle
import traceback


def main(in_fd: int, out_fd: int) -> None:
    from multiprocessing.connection import Connection

    reader, writer = Connection(in_fd, writable=False), Connection(out_fd, readable=False)
    try:
        from energon_pack.sft import length_pass as D

        D._worker_init(reader.recv())
    except BaseException:  # noqa: BLE001 - reported to the parent, which falls back to forked workers
        writer.send(("setup_error", traceback.format_exc()))
        return
    serve(reader, writer)


def serve(reader, writer) -> None:
    """Answer ``("ready", None)``, then run tasks until ``None`` (also the loop of a forked worker)."""
    from energon_pack.sft import length_pass as D

    try:
        writer.send(("ready", None))
        while True:
            task = reader.recv()
            if task is None:
                return
            try:
                result = ("ok", D._worker_range(task))
            except BaseException as exc:  # noqa: BLE001 - raised in the parent, as a forked pool does
                try:
                    pickle.loads(pickle.dumps(exc))
                except Exception:
                    exc = RuntimeError(f"length pass worker {os.getpid()}: {exc!r}")
                result = ("raise", exc)
            writer.send(result)
    except (EOFError, OSError):  # the parent stopped listening (it raised, or was interrupted)
        return
