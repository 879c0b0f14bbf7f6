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

The length pass itself (batched, one process pool, identical to the serial pass) lives in
:mod:`.length_pass`, which reads the dataset through a protocol and never imports this module.

Index :data:`PADDING_INDEX` (-1) returns a synthetic padding sample (one pad token, no loss),
used by the sampler to give every data-parallel rank the same number of steps.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, SampleSkipped
from ..packing.spec import DEFAULTS
from ..records import decode_json_record
from ..thd import check_text_overlength
from .formats import FORMATS, ChatFormat, Encoded, PromptCompletionFormat, make_format
from .index import LineIndex, cache_path, file_fingerprint, load_cached, save_cached
from .length_pass import _literal_control_contents, default_workers, run_length_pass
from .token_bound import backend, chat_texts, max_bytes_per_token

PADDING_INDEX = -1
PADDING_KEY = "__padding__"
#: lines with more text than this (UTF-8 bytes) may be called too long by their bytes alone
#: (:meth:`JsonlSFTDataset._reject_by_bytes`); shorter ones are tokenised, details exactly as before
BYTE_BOUND_MIN_BYTES = 1 << 20
LENGTHS_VERSION = 2  # 2: control tokens in text and lone surrogates are skips


#: the prompt/completion field names read without flags, in order: ours (TRL's), NeMo / Megatron-Bridge GPT-SFT's
#: ``{"input", "output"}``, then alpaca's without ``input``; a record with an ``instruction`` is read as alpaca is
#: under either of the last two (:func:`energon_pack.sft.formats._prompt_text`)
FIELD_PAIRS = (("prompt", "completion"), ("input", "output"), ("instruction", "output"))
#: how many leading records decide the field pair
FIELD_SNIFF_LINES = 64


def field_pair(index: Any) -> tuple[str, str]:
    """The prompt/completion field names of a file: the first pair of :data:`FIELD_PAIRS` that the leading records
    hold (``prompt``/``completion`` when none does, so the skips name the default)."""
    seen: set[str] = set()
    for i in range(min(len(index), FIELD_SNIFF_LINES)):
        try:
            record = decode_json_record(index.line(i))
        except SampleSkipped:
            continue
        if isinstance(record, dict):
            seen.update(record)
    for pair in FIELD_PAIRS:
        if set(pair) <= seen:
            return pair
    return FIELD_PAIRS[0]


def refuse_json_array(path: str | os.PathLike) -> None:
    """A ConfigError with the fix when ``path`` holds one JSON array (``[{...}, ...]``) rather than JSONL: read as
    lines, every line of it would be an ``invalid_json`` skip."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return  # the line index reports a missing or unreadable file
    if head.startswith(b"["):
        raise ConfigError(
            "path",
            f"{path} is one JSON array; GPT-SFT data is JSONL (one JSON object per line)",
            "write it as JSONL: python -c "
            '"import json,sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]" '
            f"{path} > {Path(path).with_suffix('.jsonl').name}",
        )


class JsonlSFTDataset:
    """GPT-SFT JSONL (prompt/completion or chat) as token ids + unshifted target masks.

    Args:
        path: the JSONL file, one record per line.
        tokenizer: a Hugging Face tokenizer (or ``tokenizers.Tokenizer``), a Qwen-VL name
            (``"qwen2.5-vl"`` ...), or ``"demo"`` for the offline demo tokenizer (``None`` uses it too,
            with a ``DemoTokenizerWarning``).
        format: ``"prompt_completion"`` (default) or ``"chat"`` (``messages`` / ShareGPT ``conversations``).
        max_length: the most tokens a sample may have, usually the pack width ``seq_length``; None: no limit.
        overlength: :attr:`PackingSpec.overlength <energon_pack.packing.spec.PackingSpec>` for a line over
            ``max_length`` (``"truncate"`` keeps its first ``max_length`` tokens; the keeping policies of the
            Qwen-VL encoders are refused here).
        cache_dir: where the line index and length caches go; None: the user cache dir.
        cache_tokens: also keep the length pass's ids on disk (4 bytes a token) so ``__getitem__`` slices
            instead of tokenising (default False).
        length_workers: processes for the length pass; None (default): one per core for files of at least
            32 MiB, else 1; 1 inside a DataLoader worker.
        length_batch: tokenise the length pass by chunks of lines (default True; same results, faster).
        format_kw: go to the format: ``prompt_field``, ``completion_field`` (default: ``prompt``/``completion``, or
            NeMo / Megatron-Bridge GPT-SFT's ``input``/``output`` when the file's leading records hold those and
            not ours: :func:`field_pair`), ``template``, ``separator``,
            ``loss`` (``"completion"|"full"``), ``add_bos``, ``add_eos`` for prompt/completion;
            ``loss_policy`` (``"assistant"|"last_turn"|"all"``), ``system_prompt``,
            ``train_newline_after_im_end`` (Megatron-Bridge's loss rule), ``preference`` (``"refuse"|"chosen"``:
            a preference record is a ``preference_data`` skip, or trains its chosen answer as SFT) for chat.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer: Any,
        format: str = "prompt_completion",
        *,
        max_length: int | None = None,
        overlength: str = DEFAULTS["overlength"],
        cache_dir: str | os.PathLike | None = None,
        cache_tokens: bool = False,
        length_workers: int | None = None,
        length_batch: bool = True,
        **format_kw: Any,
    ) -> None:
        if format not in FORMATS:
            raise ConfigError("format", f"unknown format {format!r}", f"use one of {FORMATS}")
        check_text_overlength(overlength, "the GPT-SFT JSONL dataset")
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2
        ):
            raise ConfigError(
                "max_length", f"must be an int >= 2 or None, got {max_length!r}", "set it to the pack width"
            )
        from ..chat.tokenizer import resolve_tokenizer

        if length_workers is not None and (
            isinstance(length_workers, bool) or not isinstance(length_workers, int) or length_workers < 1
        ):
            raise ConfigError(
                "length_workers",
                f"must be an int >= 1 or None (auto), got {length_workers!r}",
                "use None (processes for files >= 32 MiB), 1 (in process) or N",
            )
        self.length_workers = length_workers
        self.length_batch = bool(length_batch)
        refuse_json_array(path)
        self.index = LineIndex(path, cache_dir)
        self.path = self.index.path
        if format == "prompt_completion" and "prompt_field" not in format_kw and "completion_field" not in format_kw:
            format_kw.update(zip(("prompt_field", "completion_field"), field_pair(self.index)))
        # no silent default: tokenizer="demo" asks for the demo tokenizer, None warns (DemoTokenizerWarning)
        self.format = make_format(format, resolve_tokenizer(tokenizer, where="JsonlSFTDataset"), **format_kw)
        self.format_name = format
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
            record = decode_json_record(self.index.line(i))
        except SampleSkipped as exc:
            record = exc
        return self._finish_line(i, record, self.format)

    def _finish_line(self, i: int, record: Any, fmt: Any) -> Encoded:
        """:meth:`encode_line` for an already decoded record (or its decode skip) with ``fmt``."""
        self._reject_by_bytes(i, record)
        try:
            if isinstance(record, SampleSkipped):
                raise record
            enc = fmt.encode(record)
        except SampleSkipped as exc:
            raise SampleSkipped(exc.reason, f"line {i + 1}: {exc.detail}") from None
        return self._apply_max_length(i, enc)

    def _overlength(self, i: int, n: int, count: str | None = None) -> Exception:
        """What line ``i`` with ``n > max_length`` tokens (described as ``count``, default
        "n tokens") raises under ``overlength`` "error" or "skip"."""
        count = count or f"{n} tokens"
        if self.overlength == "error":
            return ValueError(
                f"{self.path}: line {i + 1} has {count} > max_length {self.max_length} "
                "(overlength='error'; use 'skip' or 'truncate')"
            )
        return SampleSkipped("too_long", f"line {i + 1}: {count} > max_length {self.max_length}")

    def _reject_by_bytes(self, i: int, record: Any) -> None:
        """Raise line ``i``'s overlength outcome when :meth:`_bytes_bound` exceeds ``max_length``,
        before anything tokenises the line: memory stays bounded for a huge line."""
        bound = self._bytes_bound(record)
        if bound is not None:
            at_least, n_bytes, per_token = bound
            raise self._overlength(
                i, at_least, f"at least {at_least} tokens ({n_bytes} bytes of text, <= {per_token} bytes a token)"
            )

    def _bytes_bound(self, record: Any) -> tuple[int, int, int] | None:
        """(at least this many tokens, text bytes, bytes a token stands for at most) when a
        record's texts hold more UTF-8 bytes than ``max_length`` tokens stand for
        (:mod:`.token_bound`), else None. A line the format would skip for another reason first
        (empty completion, lone surrogate, typed control token, no assistant turn) is left to it."""
        texts = self._bounded_texts(record)
        if texts is None:
            return None
        per_token = self._byte_bound[0]
        try:
            n_bytes = sum(len(text.encode("utf-8")) for text in texts)
        except UnicodeEncodeError:
            return None
        at_least = -(-n_bytes // per_token)
        return (at_least, n_bytes, per_token) if at_least > self.max_length and n_bytes > BYTE_BOUND_MIN_BYTES else None

    def _bounded_texts(self, record: Any) -> list[str] | None:
        """Texts the format tokenises (prompt/completion) or renders at least (chat) when they may
        be over-long by their bytes alone (:meth:`_byte_gate`), else None."""
        fmt = self.format
        if type(record) is not dict:
            return None
        if isinstance(fmt, ChatFormat):
            if not self._byte_gate(1 << 62) or not self._byte_gate(_string_chars(record)):
                return None
            texts = chat_texts(record, self._byte_bound[1], fmt.preference)
            return texts if texts is not None and self._byte_gate(sum(map(len, texts))) else None
        if not isinstance(fmt, PromptCompletionFormat):
            return None
        prompt, completion = fmt.plain_prompt(record), record.get(fmt.completion_field)  # None: the format decides
        if prompt is None or type(completion) is not str or not self._byte_gate(len(prompt) + len(completion)):
            return None
        if not completion.strip():
            return None
        if fmt.strip_whitespace:
            prompt, completion = prompt.strip(), completion.strip()
        # the two texts the format tokenises (a control token may straddle template/separator and text)
        texts = [fmt.template.format_map({"prompt": prompt, fmt.prompt_field: prompt}), fmt.separator + completion]
        return None if any(c in text for text in texts for c in self._byte_bound[1]) else texts

    def _byte_gate(self, chars: int) -> bool:
        """Whether ``chars`` characters of prompt/completion text may hold more than
        :data:`BYTE_BOUND_MIN_BYTES` and more bytes than ``max_length`` tokens stand for (UTF-8:
        at most 4 bytes a character); O(1)."""
        if self.max_length is None or self.overlength == "truncate" or 4 * chars <= BYTE_BOUND_MIN_BYTES:
            return False
        per_token = self._byte_bound[0]
        return per_token is not None and 4 * chars > per_token * self.max_length

    @property
    def _byte_bound(self) -> tuple[int | None, tuple[str, ...]]:
        """(bytes a token stands for at most, the control tokens' texts) or (None, ()) without a bound."""
        bound = self.__dict__.get("_byte_bound_cache")
        if bound is None:
            tok = self.format.tokenizer
            per_token, inner = max_bytes_per_token(tok), backend(tok)
            contents = _literal_control_contents(inner, tok.control_ids) if per_token is not None else None
            bound = self._byte_bound_cache = (per_token, contents) if contents is not None else (None, ())
        return bound

    def _apply_max_length(self, i: int, enc: Encoded) -> Encoded:
        if self.max_length is not None and len(enc) > self.max_length:
            if self.overlength != "truncate":
                raise self._overlength(i, len(enc))
            enc = enc.truncated(self.max_length)
            if not enc.target_mask[1:].any():
                raise SampleSkipped("no_trained_tokens", f"line {i + 1}: nothing supervised after truncation")
        return Encoded(enc.input_ids, enc.target_mask, key=i + 1)

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
        return {
            "version": LENGTHS_VERSION,
            "kind": "lengths",
            "source": file_fingerprint(self.path),
            "format": self.format.fingerprint(),
            "max_length": self.max_length,
            "overlength": self.overlength,
        }

    def _load_or_compute_lengths(self) -> None:
        meta = self._lengths_meta()
        tag = meta["format"].replace(":", "-")
        npy = cache_path(self.path, f".len-{tag}.npy", self.cache_dir)
        tok_npy = cache_path(self.path, f".tok-{tag}.npy", self.cache_dir)
        cached = load_cached(npy, meta, expected_len=len(self))
        if cached is not None:
            lengths = np.asarray(cached[0])
            tokens = (
                load_cached(tok_npy, meta, expected_len=int(np.maximum(lengths, 0).sum()))
                if self.cache_tokens
                else None
            )
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
        save_cached(
            lengths, npy, {**meta, "reasons": self._reasons, "details": {str(k): v for k, v in details.items()}}
        )

    def compute_lengths(self, workers: int | None = None, batch: bool | None = None) -> tuple:
        """The length pass (no cache): (int32 lengths, reasons, details, int32 tokens | None).

        ``workers`` processes (default: the constructor's ``length_workers`` rule) over
        contiguous line ranges, merged in line order; ``batch`` tokenises by chunks. Every
        combination gives the same result as the serial per-line pass (:mod:`.length_pass`)."""
        return run_length_pass(
            self, default_workers(self) if workers is None else workers, self.length_batch if batch is None else batch
        )

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

    def skip_example(self, reason: str) -> str | None:
        """``"line N: detail"`` of the first line skipped for ``reason`` (None when there is none)."""
        return next((detail or f"line {n}" for n, r, detail in self.skipped_lines if r == reason), None)

    def mismatch_hint(self) -> str:
        """What to check when the records do not match the format (for
        :class:`~energon_pack.errors.AllSkippedError`)."""
        fields = (
            f" (it reads {self.format.prompt_field!r} / {self.format.completion_field!r}: rename with "
            "prompt_field= / completion_field=)"
            if isinstance(self.format, PromptCompletionFormat)
            else ""
        )
        return (
            f"the records may not match format={self.format_name!r}{fields}: compare the field names with the "
            f"example, or use another format (one of {FORMATS}); `energon-pack inspect {self.path}` lists "
            "the fields the records have"
        )

    @property
    def skipped_lines(self) -> list[tuple[int, str, str]]:
        """(1-based line number, reason, detail) of every unusable line (details capped at 10k lines)."""
        lengths = self.lengths
        bad = np.flatnonzero(lengths < 0)
        return [(int(i) + 1, self._reasons[-1 - int(lengths[i])], self._details.get(int(i) + 1, "")) for i in bad]


def _string_chars(node: Any) -> int:
    """Characters in every string of a parsed JSON record (iterative; a cheap upper bound on its text)."""
    total, stack = 0, [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total
