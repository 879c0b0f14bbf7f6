"""The GPT-SFT length pass: every line of a JSONL file tokenised once for its length (and
skip reason), fast.

Lines are tokenised in batches (:data:`LENGTH_CHUNK` lines: the texts a record will tokenise are
collected and encoded with one ``encode_batch_fast`` of a raw ``tokenizers.Tokenizer`` or one
batch call of a Hugging Face fast tokenizer, then served to the format from a per-chunk memo;
anything the memo lacks is encoded one by one as before) and, for files of at least
:data:`PARALLEL_MIN_BYTES` (or ``length_workers=N``), in one pool of N processes
(:func:`~energon_pack.processes.process_pool`, forked: the dataset is inherited, not pickled; the workers
die with the process that started them) over contiguous line
ranges of at most about :data:`RANGE_LINES` lines (so both cores stay busy to the end), merged
in line order: lengths, skip reasons, reason codes, details and cached tokens are identical to
the serial per-line pass (``length_workers=1, length_batch=False``). Prompt/completion lines
take a lean route (:class:`_LeanPromptCompletion`): the length is arithmetic on the two texts'
token counts (no id lists at all without ``cache_tokens`` when the tokenizer allows it), and
only unusual lines go through the format; the tokenizer is then ~97% of the pass.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..chat.tokenizer import _is_raw_tokenizers
from ..env import environ_set
from ..errors import ConfigError, SampleSkipped
from ..processes import KeptProcesses, process_pool
from ..records import decode_json_record
from .formats import Encoded, PromptCompletionFormat
from .index import LineIndex, file_changed_error, file_identity

MAX_LOGGED_DETAILS = 10000
LENGTH_CHUNK = 128  # lines per batch tokenisation in the length pass (256 texts: ~3% faster than 1024)
PARALLEL_MIN_BYTES = 32 << 20  # length_workers=None uses processes from this file size on
RANGES_PER_WORKER = 4  # at least this many line ranges per process (load balance)
RANGE_LINES = 8192  # and ranges of at most about this many lines, so no process idles long at the end
#: called with 0 when a pass starts, then with the lines of each finished range (``inspect``'s
#: progress bar); None: silent
_progress: Callable[[int], None] | None = None


@contextlib.contextmanager
def progress(callback: Callable[[int], None]) -> Iterator[None]:
    """Report the pass's progress to ``callback(lines)`` inside the block (serial passes run in ranges then)."""
    global _progress
    saved, _progress = _progress, callback
    try:
        yield
    finally:
        _progress = saved


def _done(result: Any, lines: int) -> Any:
    if _progress is not None:
        _progress(lines)
    return result


class LineSource(Protocol):
    """What the pass reads of a :class:`~energon_pack.sft.JsonlSFTDataset` (a protocol, so this module,
    which the dataset imports, never imports it back)."""

    path: Path
    index: LineIndex
    format: Any
    max_length: int | None
    overlength: str
    cache_tokens: bool
    length_workers: int | None

    def __len__(self) -> int: ...

    def encode_line(self, i: int) -> Encoded: ...

    def _finish_line(self, i: int, record: Any, fmt: Any) -> Encoded: ...

    def _overlength(self, i: int, n: int, count: str | None = None) -> Exception: ...

    def _bytes_bound(self, record: Any) -> tuple[int, int, int] | None: ...

    def _byte_gate(self, chars: int) -> bool: ...


class _BatchMemo:
    """Batch encodes the texts of a chunk ahead and hands the format a copy of its tokenizer
    adapter (same class, so ``as_qwen_tokenizer`` keeps it) whose ``encode``/``encode_text``
    serve them from a memo.

    The memo holds exactly the ids the adapter would compute (batch and single encodes agree);
    a text not in the memo, or one whose ids hold a control token, goes to the adapter itself
    (same result, same skip detail)."""

    def __init__(self, adapter: Any) -> None:
        import copy

        self._memo: dict[str, list[int]] = {}
        inner = adapter.inner
        self.batch_encode = self.batch_lengths = None
        self.control_contents: tuple[str, ...] | None = None
        if _is_raw_tokenizers(inner):
            if inner.padding is not None or inner.truncation is not None:
                pass  # a batch would pad/truncate where the adapter's single encodes do not: no batch path
            else:
                fast = getattr(inner, "encode_batch_fast", None) or inner.encode_batch
                self.batch_encode = lambda texts: [e.ids for e in fast(texts, add_special_tokens=False)]
                self.batch_lengths = lambda texts: [len(e) for e in fast(texts, add_special_tokens=False)]
                self.control_contents = _literal_control_contents(inner, adapter.control_ids)
        elif getattr(inner, "is_fast", False) and callable(inner):
            self.batch_encode = lambda texts: inner(texts, add_special_tokens=False)["input_ids"]
        self.hits = self.misses = 0
        memo = self._memo_get
        control = adapter.control_ids

        def encode(text: str) -> list[int]:
            ids = memo(text)
            return adapter.encode(text) if ids is None else list(ids)

        def encode_text(text: str) -> list[int]:
            ids = memo(text)
            if ids is None or not control.isdisjoint(ids):
                return adapter.encode_text(text)
            return list(ids)

        self.tokenizer = copy.copy(adapter)
        self.tokenizer.encode = encode
        self.tokenizer.encode_text = encode_text

    def _memo_get(self, text: str) -> list[int] | None:
        ids = self._memo.get(text) if text else None
        if ids is None:
            self.misses += 1
        else:
            self.hits += 1
        return ids

    @staticmethod
    def encodable(texts: list[str]) -> list[str]:
        """The distinct non-empty ``texts`` that encode as UTF-8 (the adapter's own encode raises
        the counted ``invalid_text`` skip for the others)."""
        unique = []
        for text in dict.fromkeys(texts):
            if not text:
                continue
            if not text.isascii():  # O(1) for str; only non-ASCII text can hold a lone surrogate
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    continue
            unique.append(text)
        return unique

    def prefetch(self, texts: list[str]) -> dict[str, list[int]]:
        """Batch encode the distinct encodable ``texts``; returns the memo (text -> ids)."""
        unique = self.encodable(texts)
        self._memo = dict(zip(unique, self.batch_encode(unique))) if unique and self.batch_encode else {}
        return self._memo


def _literal_control_contents(inner: Any, control_ids: frozenset[int]) -> tuple[str, ...] | None:
    """The control tokens' texts when a text can produce a control id only by containing one of
    them literally, else None.

    True for a raw ``tokenizers.Tokenizer`` whose control ids are all added tokens outside the
    model's vocabulary (the model never emits them) matched on the raw text (``normalized=False``
    or no normalizer): the added vocabulary is the only way to such an id, and it matches a
    token's exact content (``lstrip``/``rstrip``/``single_word`` only narrow that). Then a text
    containing none of them needs no look at its ids to rule out ``control_token_in_text``."""
    try:
        added = inner.get_added_tokens_decoder()
        model_ids = set(inner.get_vocab(with_added_tokens=False).values())
    except Exception:  # pragma: no cover - an unusual tokenizer: keep the ids check
        return None
    contents = []
    for tid in sorted(control_ids):
        tok = added.get(tid)
        if tok is None or tid in model_ids or not tok.content or (tok.normalized and inner.normalizer is not None):
            return None
        contents.append(tok.content)
    return tuple(contents)


def _recorder(adapter: Any) -> tuple[Any, list[str]]:
    """A copy of the adapter that records the texts a format asks for (and returns no ids)."""
    import copy

    texts: list[str] = []
    rec = copy.copy(adapter)

    def encode(text: str) -> list[int]:
        texts.append(text)
        return []

    rec.encode = rec.encode_text = encode
    return rec, texts


def _with_tokenizer(fmt: Any, tokenizer: Any) -> Any:
    """A shallow copy of the (frozen dataclass) format using ``tokenizer``."""
    import copy

    clone = copy.copy(fmt)
    object.__setattr__(clone, "tokenizer", tokenizer)
    return clone


def _format_texts(fmt: Any, recorder_fmt: Any, recorded: list[str], record: Any) -> list[str]:
    """The texts ``fmt.encode(record)`` will tokenise: derived directly for prompt/completion,
    recorded from a dry run for other formats (a text missed here is only a memo miss)."""
    if isinstance(fmt, PromptCompletionFormat):
        if not isinstance(record, dict):
            return []
        prompt, completion = fmt.plain_prompt(record), record.get(fmt.completion_field)
        if prompt is None or not isinstance(completion, str):
            return []
        if fmt.strip_whitespace:
            prompt, completion = prompt.strip(), completion.strip()
        return [fmt.template.format_map({"prompt": prompt, fmt.prompt_field: prompt}), fmt.separator + completion]
    recorded.clear()
    try:
        recorder_fmt.encode(record)
    except Exception:
        pass
    return list(recorded)


class _LeanPromptCompletion:
    """The length pass for prompt/completion lines without per-line Python objects.

    A line whose record is an object with string fields, whose texts encode (batch) to no
    control token, and whose length needs nothing from the format gets its length by arithmetic
    on the two texts' token counts: ``[bos] + prompt ids + separator/completion ids + [eos]``,
    supervised from the prompt's end (``loss="completion"``) or everywhere (``"full"``), cut
    to ``max_length`` (``truncate``), counted ``too_long`` (``skip``) or raised (``error``):
    exactly what :meth:`PromptCompletionFormat.encode` and
    :meth:`JsonlSFTDataset._apply_max_length` compute. Every other line (a decode error, a
    missing/empty field, a control token, a lone surrogate, nothing supervised) goes through
    the format itself, in line order, so skip reasons, details and errors are the serial pass's.

    Without a token cache, and when a text can produce a control id only by containing its text
    (:func:`_literal_control_contents`), the batch gives token counts only (no id lists are
    built); a text containing a control token's text goes through the format."""

    def __init__(self, ds: LineSource, memo: _BatchMemo) -> None:
        fmt = ds.format
        self.ds = ds
        self.pf, self.cf = fmt.prompt_field, fmt.completion_field
        self.plain = fmt.template in ("{prompt}", "{" + fmt.prompt_field + "}")  # format_map(...) is the prompt
        self.template, self.sep, self.strip = fmt.template, fmt.separator, fmt.strip_whitespace
        self.head = [fmt.bos_id] if fmt.add_bos else []
        self.tail = [fmt.eos_id] if fmt.add_eos else []
        self.full = fmt.loss == "full"
        self.control = fmt.tokenizer.control_ids
        self.max_length = ds.max_length
        self.overlength = ds.overlength
        self.counts_only = not ds.cache_tokens and memo.batch_lengths is not None and memo.control_contents is not None

    def _texts(self, chunk: int, end: int) -> tuple[list[Any], list[str]]:
        """Per line of [chunk, end): (prompt text, completion text, record), or the record /
        SampleSkipped for the format; and the texts to encode."""
        ends = self.ds.index.ends
        lo = int(ends[chunk - 1]) + 1 if chunk > 0 else 0
        block = self.ds.index.read(lo, int(ends[end - 1]))
        pf, cf, plain, template, sep, strip = self.pf, self.cf, self.plain, self.template, self.sep, self.strip
        prompt_of = self.ds.format.plain_prompt  # None: the format reads more than the prompt field
        gate, too_long = self.ds._byte_gate, self.ds._bytes_bound
        rows: list[Any] = []
        texts: list[str] = []
        prev = 0
        for off in (ends[chunk:end] - lo).tolist():
            raw, prev = block[prev:off], off + 1
            try:
                rec = decode_json_record(raw)
            except SampleSkipped as exc:
                rows.append(exc)
                continue
            if type(rec) is not dict:
                rows.append(rec)
                continue
            prompt, completion = prompt_of(rec), rec.get(cf)
            if prompt is None or type(completion) is not str:
                rows.append(rec)
                continue
            if strip:
                prompt, completion = prompt.strip(), completion.strip()
                if not completion:
                    rows.append(rec)
                    continue
            elif not completion.strip():
                rows.append(rec)
                continue
            if gate(len(prompt) + len(completion)) and too_long(rec):  # by its bytes alone: the format's route
                rows.append(rec)
                continue
            ptext = prompt if plain else template.format_map({"prompt": prompt, pf: prompt})
            ctext = sep + completion
            texts.append(ptext)
            texts.append(ctext)
            rows.append((ptext, ctext, rec))
        return rows, texts

    def chunk(
        self,
        chunk: int,
        end: int,
        memo: _BatchMemo,
        exact: Any,
        skip: Any,
        lengths: np.ndarray,
        start: int,
        parts: list | None,
    ) -> None:
        """Lengths of lines [chunk, end) into ``lengths[i - start]``; ``exact(i, record_or_skip)``
        for the lines the format handles itself, ``skip(i, SampleSkipped)`` for a ``too_long``
        line; packed tokens appended to ``parts`` in line order."""
        rows, texts = self._texts(chunk, end)
        if self.counts_only:
            memo._memo = {}  # the format's lines encode on their own
            unique = memo.encodable(texts)
            count_of = dict(zip(unique, memo.batch_lengths(unique))) if unique else {}
            contents = memo.control_contents
            for i, row in enumerate(rows, chunk):
                if type(row) is tuple:
                    ptext, ctext, rec = row
                    n_prompt = count_of.get(ptext) if ptext else 0
                    n_completion = count_of.get(ctext) if ctext else 0
                    if (
                        n_prompt is not None
                        and n_completion is not None
                        and not any(c in ptext or c in ctext for c in contents)
                    ):
                        placed = self._place(i, start, n_prompt, n_completion, lengths)
                        if placed is not False:
                            if placed is not True:
                                skip(i, placed)
                            continue
                    row = rec
                exact(i, row)
            return
        ids_of = memo.prefetch(texts)
        control, head, tail = self.control, self.head, self.tail
        empty: list[int] = []
        flat: list[int] = []
        runs: list[int] = []  # per line in ``flat``: first supervised position, kept length

        def flush() -> None:
            if flat:
                ids = np.asarray(flat, dtype=np.int64)
                sup = np.zeros(len(ids), dtype=np.int64)
                pos = 0
                for first, kept in zip(runs[::2], runs[1::2]):
                    sup[pos + first : pos + kept] = 1
                    pos += kept
                parts.append(ids * 2 + sup)
                flat.clear()
                runs.clear()

        for i, row in enumerate(rows, chunk):
            if type(row) is tuple:
                ptext, ctext, rec = row
                pids = ids_of.get(ptext) if ptext else empty
                cids = ids_of.get(ctext) if ctext else empty
                if pids is not None and cids is not None and control.isdisjoint(pids) and control.isdisjoint(cids):
                    placed = self._place(i, start, len(pids), len(cids), lengths)
                    if placed is True:
                        if parts is not None:
                            kept = int(lengths[i - start])
                            line_ids = head + pids + cids + tail
                            flat.extend(line_ids[:kept])
                            runs.append(0 if self.full else len(head) + len(pids))
                            runs.append(kept)
                        continue
                    if placed is not False:
                        skip(i, placed)  # no tokens for a skipped line: nothing to flush
                        continue
                row = rec
            if parts is not None:
                flush()
            exact(i, row)
        if parts is not None:
            flush()

    def _place(self, i: int, start: int, n_prompt: int, n_completion: int, lengths: np.ndarray) -> bool | SampleSkipped:
        """True: line ``i``'s length is stored; a SampleSkipped: the line is ``too_long`` (``skip``);
        False: the format must see the line (nothing supervised). Raises under ``overlength="error"``."""
        n_prompt += len(self.head)
        n = n_prompt + n_completion + len(self.tail)
        first = 0 if self.full else n_prompt
        # the format's own check: >= 2 tokens and a supervised token at position >= 1
        if n < 2 or n <= max(1, first):
            return False
        kept = n
        if self.max_length is not None and n > self.max_length:
            if self.overlength == "skip":
                return self.ds._overlength(i, n)
            if self.overlength == "error":
                raise self.ds._overlength(i, n)
            kept = self.max_length
            if kept <= max(1, first):  # nothing supervised after truncation
                return False
        lengths[i - start] = kept
        return True


def _raise(exc: BaseException) -> Any:
    raise exc


def _length_range(ds: LineSource, start: int, stop: int, batch: bool) -> tuple:
    """(lengths int32, reasons in order of first use, details, tokens int32 | None) of lines [start, stop)."""
    lengths = np.empty(stop - start, dtype=np.int32)
    codes: dict[str, int] = {}
    details: dict[int, str] = {}
    parts: list[np.ndarray] = []

    def record(i: int, fn) -> None:
        try:
            enc = fn()
            lengths[i - start] = len(enc)
            if ds.cache_tokens:
                parts.append(enc.input_ids * 2 + enc.target_mask)
        except SampleSkipped as exc:
            code = codes.setdefault(exc.reason, len(codes))
            lengths[i - start] = -1 - code
            if len(details) < MAX_LOGGED_DETAILS:
                details[i + 1] = exc.detail

    memo = _BatchMemo(ds.format.tokenizer) if batch else None
    if memo is None or memo.batch_encode is None:
        for i in range(start, stop):
            record(i, lambda i=i: ds.encode_line(i))  # called at once, inside this iteration
    else:
        # the batched pass makes (next to) no reference cycles, so the cyclic collector would only
        # walk the (forked) heap again and again: ~4% of a worker's time; any cycle is collected after
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            fmt = _with_tokenizer(ds.format, memo.tokenizer)
            recorder, recorded = _recorder(ds.format.tokenizer)
            recorder_fmt = _with_tokenizer(ds.format, recorder)
            lean = _LeanPromptCompletion(ds, memo) if isinstance(ds.format, PromptCompletionFormat) else None
            for chunk in range(start, stop, LENGTH_CHUNK):
                end = min(stop, chunk + LENGTH_CHUNK)
                if lean is not None:
                    lean.chunk(
                        chunk,
                        end,
                        memo,
                        lambda i, rec: record(i, lambda: ds._finish_line(i, rec, fmt)),
                        lambda i, exc: record(i, lambda: _raise(exc)),
                        lengths,
                        start,
                        parts if ds.cache_tokens else None,
                    )
                    continue
                records: list[Any] = []
                texts: list[str] = []
                for i in range(chunk, end):
                    try:
                        rec = decode_json_record(ds.index.line(i))
                        if ds._bytes_bound(rec) is None:  # else too long by its bytes: never tokenised
                            texts.extend(_format_texts(ds.format, recorder_fmt, recorded, rec))
                        records.append(rec)
                    except SampleSkipped as exc:
                        records.append(exc)
                memo.prefetch(texts)
                for i, rec in zip(range(chunk, end), records):
                    record(i, lambda i=i, rec=rec: ds._finish_line(i, rec, fmt))  # called at once
        finally:
            if gc_enabled:
                gc.enable()
    tokens = None
    if ds.cache_tokens:
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if len(tokens) and int(tokens.max()) >= 2**31:
            raise ConfigError("cache_tokens", "token ids too large for the int32 cache", "use cache_tokens=False")
        tokens = tokens.astype(np.int32)
    return lengths, list(codes), details, tokens


_WORKER_DS: LineSource | None = None
_WORKER_TAKEN: Any = None  # in a pool worker: the shared array of the pid that took each task


def _worker_init(ds: LineSource, taken: Any = None) -> None:
    """A pool worker's initializer: the dataset to measure (inherited by fork), and where it notes the
    tasks it takes."""
    global _WORKER_DS, _WORKER_TAKEN
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_DS, _WORKER_TAKEN = ds, taken


def _worker_range(args: tuple[int, int, bool]) -> tuple:
    return _length_range(_WORKER_DS, *args)


def _pool_task(k: int, task: tuple[int, int, bool]) -> tuple:
    """Task ``k`` in a pool worker: noted as taken by this pid first (so a death can name its lines); an
    exception that does not pickle is raised as a RuntimeError naming it instead."""
    _WORKER_TAKEN[k] = os.getpid()
    try:
        return _worker_range(task)
    except BaseException as exc:  # noqa: BLE001 - raised in the parent, as the serial pass raises it
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            raise RuntimeError(f"length pass worker {os.getpid()}: {exc!r}") from None
        raise


def _death(processes: list[Any], taken: Any, tasks: list[tuple], running: list[int]) -> ConfigError:
    """The error for the pool worker that died: the lines of the task it had taken (of ``running``, the
    tasks that never finished) and how it ended. Once one dies the pool stops the others (SIGTERM), so a
    worker that ended otherwise is the one that died first."""
    import signal

    exits = {proc.pid: proc.exitcode for proc in processes}
    dead = [(k, exits.get(taken[k])) for k in running if exits.get(taken[k]) not in (None, 0)]
    dead.sort(key=lambda kc: (kc[1] == -signal.SIGTERM, kc[0]))
    if dead:
        k, code = dead[0]
        lines = f"lines {tasks[k][0] + 1}-{tasks[k][1]}"
    else:  # it died before it took a task (e.g. in its initializer)
        code = next((c for c in exits.values() if c not in (None, 0)), None)
        lines = f"lines {tasks[0][0] + 1}-{tasks[-1][1]}"
    if code is None:
        how = "left the pool while still running"
    elif code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        how = f"killed by {name}" + (" (the OOM killer sends it)" if -code == signal.SIGKILL else "")
    else:
        how = f"exited with status {code}"
    return ConfigError(
        "length_workers",
        f"the length-pass worker for {lines} died ({how})",
        "give the pass more memory, or rerun with length_workers=1 to see that range's own error",
    )


def _pool_results(ds: LineSource, tasks: list[tuple], workers: int) -> list:
    """Results of ``tasks`` (in order) from one ``ProcessPoolExecutor`` of ``workers`` processes, reported to
    the progress callback as each finishes. The first failing task's exception is raised once every earlier
    task has run (the serial pass's error); a worker that dies raises :func:`_death` at once (never a hang)."""
    ctx = KeptProcesses()
    taken = ctx.Array("q", len(tasks), lock=False)  # the pid that took task k (0: not yet taken)
    results: list = [None] * len(tasks)
    errors: dict[int, BaseException] = {}
    with process_pool(workers, _worker_init, (ds, taken), ctx) as pool:
        with environ_set("TOKENIZERS_PARALLELISM", "false"):  # the first submit forks: silences tokenizers' warning
            futures = {pool.submit(_pool_task, k, task): k for k, task in enumerate(tasks)}
        for future in as_completed(futures):
            k = futures[future]
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is None:
                results[k] = _done(future.result(), tasks[k][1] - tasks[k][0])
            elif isinstance(exc, BrokenProcessPool):
                pool.shutdown(wait=True, cancel_futures=True)
                running = [j for j in range(len(tasks)) if results[j] is None and j not in errors]
                raise _death(ctx.processes, taken, tasks, running) from None
            else:  # no new task starts; the ones running finish, and the earliest error wins
                errors[k] = exc
                for other in futures:
                    other.cancel()
    if errors:
        raise errors[min(errors)]
    return results


def default_workers(ds: LineSource) -> int:
    """Processes for the length pass: ``length_workers``, else the usable cores from
    :data:`PARALLEL_MIN_BYTES` on; 1 inside a daemon process (a DataLoader worker)."""
    if ds.length_workers is not None:
        workers = ds.length_workers
    else:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if ds.path.stat().st_size < PARALLEL_MIN_BYTES:
            workers = 1
    if multiprocessing.current_process().daemon:  # e.g. inside a DataLoader worker: no children allowed
        workers = 1
    return max(1, min(workers, len(ds) // LENGTH_CHUNK or 1))


def run_length_pass(ds: LineSource, workers: int, batch: bool) -> tuple:
    """(int32 lengths, reasons, details, int32 tokens | None) of every line of ``ds``: serially, or
    in one pool of ``workers`` processes over line ranges, merged in line order; identical to the
    serial per-line pass either way."""
    before = file_identity(ds.path)
    if before != ds.index.identity:
        raise file_changed_error(
            ds.path, f"size, mtime_ns, inode {ds.index.identity} when the line index was built, {before} now"
        )
    result = _run_length_pass(ds, workers, batch)
    after = file_identity(ds.path)
    if after != before:
        raise file_changed_error(ds.path, f"size, mtime_ns, inode {before} before it, {after} after")
    return result


def _run_length_pass(ds: LineSource, workers: int, batch: bool) -> tuple:
    n = len(ds)
    if n == 0 or (workers <= 1 and (_progress is None or n <= RANGE_LINES)):
        return _done(_length_range(ds, 0, n, batch), n)
    pieces = min(n, max(workers * RANGES_PER_WORKER, -(-n // RANGE_LINES)))
    bounds = np.linspace(0, n, pieces + 1).astype(np.int64).tolist()
    tasks = [(bounds[k], bounds[k + 1], batch) for k in range(pieces) if bounds[k + 1] > bounds[k]]
    _done(None, 0)  # the pass has started
    if workers <= 1:  # serial in ranges, for the progress callback
        results = [_done(_length_range(ds, *task), task[1] - task[0]) for task in tasks]
    else:
        state = {**ds.__dict__, "_tokens": None, "_lengths": None, "_starts": None}
        clone = object.__new__(type(ds))
        clone.__dict__.update(state)
        results = _pool_results(clone, tasks, workers)
    lengths = np.empty(n, dtype=np.int32)
    codes: dict[str, int] = {}
    details: dict[int, str] = {}
    token_parts = []
    for (start, stop, _), (part, reasons, part_details, tokens) in zip(tasks, results):
        remap = np.asarray([codes.setdefault(r, len(codes)) for r in reasons], dtype=np.int32)
        bad = part < 0
        part = part.copy()
        if bad.any():
            part[bad] = -1 - remap[-1 - part[bad]]
        lengths[start:stop] = part
        for line, detail in part_details.items():
            if len(details) >= MAX_LOGGED_DETAILS:
                break
            details[line] = detail
        if tokens is not None:
            token_parts.append(tokens)
    tokens = (np.concatenate(token_parts) if token_parts else np.zeros(0, dtype=np.int32)) if ds.cache_tokens else None
    return lengths, list(codes), details, tokens
