"""Build time and encode speed of the offline Qwen tokenizer (``energon_pack.chat.qwen_vocab``):
our ``tokenizers`` BPE against ``tiktoken`` on the same ranks, on a few MB of local text.

    .venv/bin/python scripts/bench_qwen_tokenizer.py [--mb 4] [--doc-chars 2000] [--repeat 3]

Corpora (nothing is downloaded): ``code`` = Python standard-library sources (code with English
comments and docstrings); ``mixed`` = seeded random text over Latin, Cyrillic, Greek, Arabic,
Hebrew, Devanagari, Thai, kana, CJK, Hangul and emoji (adversarial: few long BPE tokens). Both are
cut into documents of ``--doc-chars`` characters (about a chat sample each). Rows:

- ``per doc``: one ``encode`` call per document in one thread, as the pipeline calls it (the loader
  parallelises over worker processes, not threads);
- ``batch``: ``encode_batch`` over all documents (tokenizers: its Rayon pool; tiktoken: a thread
  pool of ``os.cpu_count()`` threads).

tiktoken does not NFC-normalise, so its input is NFC-normalised beforehand (outside the timing);
``tokenizers`` normalises as part of ``encode``. The ids are checked equal before timing.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sysconfig
import tempfile
import time
import unicodedata


def code_corpus(chars: int) -> str:
    out, total = [], 0
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        total += len(text)
        if total >= chars:
            break
    return "".join(out)[:chars]


def mixed_corpus(chars: int, seed: int = 0) -> str:
    ranges = [
        (0x20, 0x7E),
        (0xA0, 0x24F),
        (0x370, 0x3FF),
        (0x400, 0x4FF),
        (0x590, 0x6FF),
        (0x900, 0x97F),
        (0xE00, 0xE7F),
        (0x3040, 0x30FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0x1F300, 0x1FAFF),
    ]
    alphabet = [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)]
    rng = random.Random(seed)
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(20000)]
    out, total = [], 0
    while total < chars:
        w = rng.choice(words) + rng.choice(" " * 8 + "\n,.")
        out.append(w)
        total += len(w)
    return "".join(out)[:chars]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="MB (UTF-8) of each corpus")
    ap.add_argument("--doc-chars", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import tiktoken

    from energon_pack.chat import qwen_vocab as Q
    from energon_pack.chat.tokenizer import QwenTokenizer

    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        Q.load_qwen_bpe(cache)
        cold = time.perf_counter() - t
        cached = best(lambda: Q.load_qwen_bpe(cache), args.repeat)
        full = best(lambda: Q.load_qwen_tokenizer("qwen2.5-vl", cache_dir=cache), args.repeat)
        raw = Q.load_qwen_tokenizer_raw("qwen2.5-vl", cache_dir=cache)
    ranks = Q.read_qwen_ranks(Q.qwen_ranks_path().read_bytes())
    specials = {tok: Q.QWEN_BPE_SIZE + i for i, (tok, _) in enumerate(Q.QWEN_ADDED_TOKENS["qwen2.5-vl"])}
    t = time.perf_counter()
    enc = tiktoken.Encoding("qwen", pat_str=Q.PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens=specials)
    tiktoken_build = time.perf_counter() - t
    print(
        f"build: cold {cold:.2f} s (recover merges + build + write cache), cached {cached:.2f} s "
        f"(read + verify cache), load_qwen_tokenizer('qwen2.5-vl') from cache {full:.2f} s; "
        f"tiktoken.Encoding from the ranks {tiktoken_build:.2f} s"
    )

    adapter = QwenTokenizer(raw, cache_size=0)  # no memo: every call really encodes
    threads = os.cpu_count() or 1
    print(
        f"\n| corpus | MB | docs | tokens | tokenizers per doc | our adapter per doc | tiktoken per doc "
        f"| tokenizers batch | tiktoken batch ({threads} threads) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    chars = int(args.mb * 1e6)
    for name, text in (("code", code_corpus(chars)), ("mixed", mixed_corpus(chars // 3))):
        text = unicodedata.normalize("NFC", text)
        docs = [text[i : i + args.doc_chars] for i in range(0, len(text), args.doc_chars)]
        mb = len(text.encode("utf-8")) / 1e6
        ours = [e.ids for e in raw.encode_batch(docs, add_special_tokens=False)]
        theirs = enc.encode_batch(docs, allowed_special="all")
        assert ours == theirs, f"{name}: tokenizers and tiktoken disagree"
        n_tokens = sum(map(len, ours))
        # best() calls each closure at once, inside this iteration; docs=docs binds it explicitly
        rows = {
            "tokenizers per doc": best(
                lambda docs=docs: [raw.encode(d, add_special_tokens=False) for d in docs], args.repeat
            ),
            "our adapter per doc": best(lambda docs=docs: [adapter.encode(d) for d in docs], args.repeat),
            "tiktoken per doc": best(
                lambda docs=docs: [enc.encode(d, allowed_special="all") for d in docs], args.repeat
            ),
            "tokenizers batch": best(lambda docs=docs: raw.encode_batch(docs, add_special_tokens=False), args.repeat),
            "tiktoken batch": best(
                lambda docs=docs: enc.encode_batch(docs, allowed_special="all", num_threads=threads), args.repeat
            ),
        }
        cells = " | ".join(f"{mb / s:.1f} MB/s" for s in rows.values())
        print(f"| {name} | {mb:.1f} | {len(docs)} | {n_tokens:,} | {cells} |")


if __name__ == "__main__":
    main()
