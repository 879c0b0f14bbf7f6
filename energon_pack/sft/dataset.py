"""JsonlSFTDataset: a map-style dataset over a JSONL file that tokenises lazily in ``__getitem__``.

Lines are read through the mmap line index (:mod:`.index`); a record becomes token ids + target
mask through a format (:mod:`.formats`). A cheap length pass (tokenise every line once, cached
as ``<file>.len-<format hash>.npy`` beside the index with the same source fingerprint) gives the
per-line lengths the :class:`TokenBudgetBatchSampler` packs by, and marks unusable lines with a
reason. Unusable lines are never yielded by the sampler; they are counted in :attr:`skips` with
their 1-based line numbers in :attr:`skipped_lines`. Calling ``ds[i]`` on such a line raises
:class:`SampleSkipped` (reason, ``"line N: ..."``).

With ``cache_tokens=True`` the length pass also keeps the ids it computed (``<file>.tok-<hash>.npy``,
4 bytes per token, id * 2 + supervised bit) and ``__getitem__`` slices them instead of tokenising:
for tokenizer-bound loaders, at the cost of disk.

The length pass tokenises in batches (:data:`LENGTH_CHUNK` lines: the texts a record will
tokenise are collected and encoded with one ``encode_batch_fast`` of a raw ``tokenizers.Tokenizer``
or one batch call of a Hugging Face fast tokenizer, then served to the format from a per-chunk
memo; anything the memo lacks is encoded one by one as before) and, for files of at least
:data:`PARALLEL_MIN_BYTES` (or ``length_workers=N``), in N processes over contiguous line
ranges, merged in line order: lengths, skip reasons, reason codes, details and cached tokens
are identical to the serial per-line pass (``length_workers=1, length_batch=False``).

Index :data:`PADDING_INDEX` (-1) returns a synthetic padding sample (one pad token, no loss),
used by the sampler to give every data-parallel rank the same number of steps.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from typing import Any

import numpy as np

from ..errors import ConfigError, SampleSkipped
from ..records import decode_json_record
from ..thd import OVERLENGTH_POLICIES
from ..chat.tokenizer import _is_raw_tokenizers
from .formats import FORMATS, Encoded, PromptCompletionFormat, make_format
from .index import LineIndex, cache_path, file_fingerprint, load_cached, save_cached

PADDING_INDEX = -1
PADDING_KEY = "__padding__"
LENGTHS_VERSION = 2  # 2: control tokens in text and lone surrogates are skips
MAX_LOGGED_DETAILS = 10000
LENGTH_CHUNK = 512  # lines per batch tokenisation in the length pass
PARALLEL_MIN_BYTES = 32 << 20  # length_workers=None uses processes from this file size on
RANGES_PER_WORKER = 4  # line ranges per process (load balance)


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
        self.batch_encode = None
        if _is_raw_tokenizers(inner):
            fast = getattr(inner, "encode_batch_fast", None) or inner.encode_batch
            self.batch_encode = lambda texts: [e.ids for e in fast(texts, add_special_tokens=False)]
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

    def prefetch(self, texts: list[str]) -> None:
        unique = []
        for text in dict.fromkeys(texts):
            if not text:
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                continue  # the adapter's own encode raises the counted skip
            unique.append(text)
        self._memo = dict(zip(unique, self.batch_encode(unique))) if unique and self.batch_encode else {}


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
        prompt, completion = record.get(fmt.prompt_field), record.get(fmt.completion_field)
        if not isinstance(prompt, str) or not isinstance(completion, str):
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


def _length_range(ds: "JsonlSFTDataset", start: int, stop: int, batch: bool) -> tuple:
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
            record(i, lambda: ds.encode_line(i))
    else:
        fmt = _with_tokenizer(ds.format, memo.tokenizer)
        recorder, recorded = _recorder(ds.format.tokenizer)
        recorder_fmt = _with_tokenizer(ds.format, recorder)
        for chunk in range(start, stop, LENGTH_CHUNK):
            end = min(stop, chunk + LENGTH_CHUNK)
            records: list[Any] = []
            texts: list[str] = []
            for i in range(chunk, end):
                try:
                    rec = decode_json_record(ds.index.line(i))
                    texts.extend(_format_texts(ds.format, recorder_fmt, recorded, rec))
                    records.append(rec)
                except SampleSkipped as exc:
                    records.append(exc)
            memo.prefetch(texts)
            for i, rec in zip(range(chunk, end), records):
                record(i, lambda: ds._finish_line(i, rec, fmt))
    tokens = None
    if ds.cache_tokens:
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if len(tokens) and int(tokens.max()) >= 2**31:
            raise ConfigError("cache_tokens", "token ids too large for the int32 cache", "use cache_tokens=False")
        tokens = tokens.astype(np.int32)
    return lengths, list(codes), details, tokens


_WORKER_DS: "JsonlSFTDataset | None" = None


def _worker_init(ds: "JsonlSFTDataset") -> None:
    global _WORKER_DS
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_DS = ds


def _worker_range(args: tuple[int, int, bool]) -> tuple:
    return _length_range(_WORKER_DS, *args)


class JsonlSFTDataset:
    """GPT-SFT JSONL (prompt/completion or chat) as token ids + unshifted target masks.

    ``tokenizer``: a Hugging Face tokenizer (or ``tokenizers.Tokenizer``), or ``"demo"`` for the
    offline demo tokenizer (``None`` uses it too, with a ``DemoTokenizerWarning``).
    ``format_kw`` go to the format: ``prompt_field``, ``completion_field``, ``template``,
    ``separator``, ``loss`` (``"completion"|"full"``), ``add_bos``, ``add_eos`` for
    prompt/completion; ``loss_policy`` (``"assistant"|"last_turn"|"all"``), ``system_prompt``
    for chat. ``max_length`` (usually the pack width) applies ``overlength``: ``skip`` (counted),
    ``truncate`` (keep the first ``max_length`` tokens) or ``error``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer: Any,
        format: str = "prompt_completion",
        *,
        max_length: int | None = None,
        overlength: str = "skip",
        cache_dir: str | os.PathLike | None = None,
        cache_tokens: bool = False,
        length_workers: int | None = None,
        length_batch: bool = True,
        **format_kw: Any,
    ) -> None:
        if format not in FORMATS:
            raise ConfigError("format", f"unknown format {format!r}", f"use one of {FORMATS}")
        if overlength not in OVERLENGTH_POLICIES:
            raise ConfigError("overlength", f"unknown policy {overlength!r}", f"use one of {OVERLENGTH_POLICIES}")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
            raise ConfigError("max_length", f"must be an int >= 2 or None, got {max_length!r}", "set it to the pack width")
        from ..chat.tokenizer import resolve_tokenizer

        if length_workers is not None and (isinstance(length_workers, bool) or not isinstance(length_workers, int)
                                           or length_workers < 1):
            raise ConfigError("length_workers", f"must be an int >= 1 or None (auto), got {length_workers!r}",
                              "use None (processes for files >= 32 MiB), 1 (in process) or N")
        self.length_workers = length_workers
        self.length_batch = bool(length_batch)
        self.index = LineIndex(path, cache_dir)
        self.path = self.index.path
        # no silent default: tokenizer="demo" asks for the demo tokenizer, None warns (DemoTokenizerWarning)
        self.format = make_format(format, resolve_tokenizer(tokenizer, where="JsonlSFTDataset"), **format_kw)
        self.pad_token_id: int = self.format.tokenizer.pad_id
        self.max_length = max_length
        self.overlength = overlength
        self.cache_dir = cache_dir
        self.cache_tokens = cache_tokens
        self._tokens: np.ndarray | None = None  # flat id * 2 + supervised, usable lines only
        self._starts: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        self._reasons: list[str] = []
        self._details: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.index)

    # ------------------------------------------------------------------ one line
    def encode_line(self, i: int) -> Encoded:
        """Tokenise line ``i`` (0-based); SampleSkipped(reason, "line N: ...") when unusable."""
        if not 0 <= i < len(self.index):
            raise IndexError(f"line index {i} out of range for {len(self.index)} lines")
        try:
            enc = self._encode_raw(self.index.line(i))
        except SampleSkipped as exc:
            raise SampleSkipped(exc.reason, f"line {i + 1}: {exc.detail}") from None
        return self._apply_max_length(i, enc)

    def _finish_line(self, i: int, record: Any, fmt: Any) -> Encoded:
        """:meth:`encode_line` for an already decoded record (or its decode skip) with ``fmt``."""
        try:
            if isinstance(record, SampleSkipped):
                raise record
            enc = fmt.encode(record)
        except SampleSkipped as exc:
            raise SampleSkipped(exc.reason, f"line {i + 1}: {exc.detail}") from None
        return self._apply_max_length(i, enc)

    def _apply_max_length(self, i: int, enc: Encoded) -> Encoded:
        if self.max_length is not None and len(enc) > self.max_length:
            if self.overlength == "error":
                raise ValueError(f"{self.path}: line {i + 1} has {len(enc)} tokens > max_length {self.max_length} "
                                 "(overlength='error'; use 'skip' or 'truncate')")
            if self.overlength == "skip":
                raise SampleSkipped("too_long", f"line {i + 1}: {len(enc)} tokens > max_length {self.max_length}")
            enc = enc.truncated(self.max_length)
            if not enc.target_mask[1:].any():
                raise SampleSkipped("no_trained_tokens", f"line {i + 1}: nothing supervised after truncation")
        return Encoded(enc.input_ids, enc.target_mask, key=i + 1)

    def _encode_raw(self, raw: bytes) -> Encoded:
        return self.format.encode(decode_json_record(raw))

    def __getitem__(self, i: int) -> Encoded:
        if i == PADDING_INDEX:
            return Encoded(np.array([self.pad_token_id], dtype=np.int64), np.zeros(1, dtype=bool), key=PADDING_KEY)
        i = int(i)
        if self.cache_tokens and 0 <= i < len(self) and self.lengths[i] > 0:
            if self._tokens is None:
                self._load_or_compute_lengths()
            start = int(self._starts[i])
            packed = np.asarray(self._tokens[start : start + int(self.lengths[i])], dtype=np.int64)
            return Encoded(packed >> 1, (packed & 1).astype(bool), key=i + 1)
        return self.encode_line(i)

    def __getstate__(self) -> dict:
        # workers re-map a file-backed token cache instead of receiving a copy of it
        return {**self.__dict__, "_tokens": None} if isinstance(self._tokens, np.memmap) else dict(self.__dict__)

    # ------------------------------------------------------------------ length pass
    @property
    def lengths(self) -> np.ndarray:
        """int32 per line: the token length (after truncation), or ``-(1 + reason code)`` for an unusable line."""
        if self._lengths is None:
            self._load_or_compute_lengths()
        return self._lengths

    def _lengths_meta(self) -> dict:
        return {"version": LENGTHS_VERSION, "kind": "lengths", "source": file_fingerprint(self.path),
                "format": self.format.fingerprint(), "max_length": self.max_length, "overlength": self.overlength}

    def _load_or_compute_lengths(self) -> None:
        meta = self._lengths_meta()
        tag = meta["format"].replace(":", "-")
        npy = cache_path(self.path, f".len-{tag}.npy", self.cache_dir)
        tok_npy = cache_path(self.path, f".tok-{tag}.npy", self.cache_dir)
        cached = load_cached(npy, meta, expected_len=len(self))
        if cached is not None:
            lengths = np.asarray(cached[0])
            tokens = load_cached(tok_npy, meta, expected_len=int(np.maximum(lengths, 0).sum())) if self.cache_tokens else None
            if not self.cache_tokens or tokens is not None:
                self._set_lengths(lengths, tokens[0] if tokens else None)
                self._reasons = list(cached[1]["reasons"])
                self._details = {int(k): v for k, v in cached[1]["details"].items()}
                return
        lengths, self._reasons, details, tokens = self.compute_lengths()
        self._details = details
        if tokens is not None:
            save_cached(tokens, tok_npy, meta)
        self._set_lengths(lengths, tokens)
        save_cached(lengths, npy, {**meta, "reasons": self._reasons, "details": {str(k): v for k, v in details.items()}})

    def _workers(self) -> int:
        if self.length_workers is not None:
            workers = self.length_workers
        else:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            if self.path.stat().st_size < PARALLEL_MIN_BYTES:
                workers = 1
        if multiprocessing.current_process().daemon:  # e.g. inside a DataLoader worker: no children allowed
            workers = 1
        return max(1, min(workers, len(self) // LENGTH_CHUNK or 1))

    def compute_lengths(self, workers: int | None = None, batch: bool | None = None) -> tuple:
        """The length pass (no cache): (int32 lengths, reasons, details, int32 tokens | None).

        ``workers`` processes (default: the constructor's ``length_workers`` rule) over
        contiguous line ranges, merged in line order; ``batch`` tokenises by chunks. Every
        combination gives the same result as the serial per-line pass."""
        workers = self._workers() if workers is None else workers
        batch = self.length_batch if batch is None else batch
        n = len(self)
        if workers <= 1 or n == 0:
            return _length_range(self, 0, n, batch)
        pieces = min(n, workers * RANGES_PER_WORKER)
        bounds = np.linspace(0, n, pieces + 1).astype(np.int64).tolist()
        tasks = [(bounds[k], bounds[k + 1], batch) for k in range(pieces) if bounds[k + 1] > bounds[k]]
        # fork: no re-import of the user's __main__ (spawn would need a main guard); workers set
        # tokenizers' own parallelism off (one process per core), so the fork is safe for it
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        state = {**self.__dict__, "_tokens": None, "_lengths": None, "_starts": None}
        clone = object.__new__(type(self))
        clone.__dict__.update(state)
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # silences tokenizers' fork warning; restored below
        try:
            pool = ctx.Pool(workers, initializer=_worker_init, initargs=(clone,))
        finally:
            if saved is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
        with pool:
            results = list(pool.imap(_worker_range, tasks))
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
        tokens = (np.concatenate(token_parts) if token_parts else np.zeros(0, dtype=np.int32)) if self.cache_tokens else None
        return lengths, list(codes), details, tokens

    def _set_lengths(self, lengths: np.ndarray, tokens: np.ndarray | None) -> None:
        self._lengths, self._tokens = lengths, tokens
        if tokens is not None:
            usable = np.maximum(np.asarray(lengths, dtype=np.int64), 0)
            self._starts = np.concatenate([[0], np.cumsum(usable)[:-1]])

    @property
    def skips(self) -> Counter:
        """Unusable lines per reason (from the length pass)."""
        lengths = self.lengths
        codes = -1 - lengths[lengths < 0]
        return Counter({self._reasons[c]: int(n) for c, n in zip(*np.unique(codes, return_counts=True))})

    @property
    def skipped_lines(self) -> list[tuple[int, str, str]]:
        """(1-based line number, reason, detail) of every unusable line (details capped at 10k lines)."""
        lengths = self.lengths
        bad = np.flatnonzero(lengths < 0)
        return [(int(i) + 1, self._reasons[-1 - int(lengths[i])], self._details.get(int(i) + 1, "")) for i in bad]
