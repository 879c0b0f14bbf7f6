"""Generate energon_pack/assets/qwen_demo_tokenizer.json (deterministic; run once, commit the output).

A small byte-level BPE (vocab 1024 + Qwen special tokens) trained on a fixed synthetic corpus,
with Qwen2's pre-tokenizer split regex + ByteLevel(use_regex=False) so digits split one by one and
the special tokens are single tokens. It is NOT Qwen's vocabulary: only for demos and tests.

    python scripts/make_demo_tokenizer.py [out_path]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
VOCAB_SIZE = 1024

WORDS = (
    "the a an of to and in is it that this what where which who how why describe image picture photo video "
    "frame show shows shown there are was were be can you your please answer question user assistant system "
    "helpful left right top bottom color red green blue yellow black white cat dog car tree house person "
    "people man woman child sky water road building table chair book phone computer screen text number "
    "one two three four five many small large big little near far inside outside on under over with without "
    "seconds time first second last next then after before because so but or not no yes I we they he she "
    "looks like appears seems contains holding standing sitting walking running playing reading writing "
    "的 图片 视频 描述 这 是 一个 什么"
).split()


def corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(3, 16)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 99999)))
        line = " ".join(words)
        line = line[0].upper() + line[1:] + rng.choice([".", "?", "!", ",", ":", ""])
        if rng.random() < 0.2:
            line += "\n"
        out.append(line)
    return out


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)  # ids above the learned vocab, like Qwen
    return tok


def main() -> None:
    out = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parents[1] / "energon_pack/assets/qwen_demo_tokenizer.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build().to_str(pretty=False) + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
