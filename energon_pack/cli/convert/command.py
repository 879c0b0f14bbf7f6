"""``energon-pack convert SOURCE OUT [...]``: the argument parser and :func:`main` (0 on success, 2
on a configuration error, worded on one line)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from energon_pack.chat.conversation import PREFERENCE_MODES
from energon_pack.cli.common import PRESET_NAMES
from energon_pack.cli.options import Parser
from energon_pack.errors import ConfigError

from .options import (
    DEFAULT_BRIDGE_PRESET,
    DEFAULT_MAX_MEDIA_MB,
    DEFAULT_MAX_SKIPPED_SHARE,
    FORMATS,
    LAYOUTS,
    MEDIA_STORES,
    VERIFY_MODES,
)
from .shards import convert
from .summary import SKIP_REASONS


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown for every option that has one (flags and None defaults say it in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser(prog: str = "energon-pack convert") -> argparse.ArgumentParser:
    """convert's own parser (one-line errors, no abbreviated options: :class:`~energon_pack.cli.options.Parser`)."""
    p = Parser(
        prog=prog,
        formatter_class=_HelpFormatter,
        description="Convert LLaVA / ShareGPT JSON(L), OpenAI-messages JSONL, LLaMA-Factory files (alpaca; ShareGPT\n"
        "with function_call / observation turns and a tools string) or Parquet VLM SFT data into\n"
        "Energon-prepared WebDataset shards (images keep their original bytes). Each written record has\n"
        "passed the loader's own structural checks; the loader's remaining skips depend on its settings\n"
        "(tokenizer, preset, limits) and are counted there.",
        epilog="examples:\n"
        "  energon-pack convert llava.json out --image-root /datasets/llava/images\n"
        "  energon-pack convert LLaMA-Factory/data/dataset_info.json#mllm_demo out   # a LLaMA-Factory dataset\n"
        "  energon-pack convert alpaca_en_demo.json out            # LLaMA-Factory alpaca (+ history, images)\n"
        "  energon-pack convert glaive_toolcall_en_demo.json out   # LLaMA-Factory tool calls\n"
        "  energon-pack convert dpo_en_demo.json out --preference chosen   # the chosen answers as SFT\n\n"
        "skip reasons (counted in the summary, up to 3 examples each):\n"
        + "\n".join(f"  {k:<25} {v}" for k, v in SKIP_REASONS.items()),
    )
    p.add_argument(
        "source",
        help="a .json / .jsonl file, a .parquet file, a folder of .parquet files, or a LLaMA-Factory dataset by "
        "name: data/dataset_info.json#mllm_demo",
    )
    p.add_argument(
        "out",
        help="output folder (new or empty; a finished output needs --overwrite), or an msc:// prefix "
        "without objects (converted locally in a temporary folder, then uploaded)",
    )
    p.add_argument(
        "--image-root",
        default=None,
        help="folder that relative image and video paths resolve against (default: guessed, the first that holds "
        "the file of: the source's folder, its LLaMA-Factory dataset_info.json folder, the current folder; the "
        "summary says how many were found where)",
    )
    p.add_argument(
        "--max-skipped-share",
        type=float,
        default=DEFAULT_MAX_SKIPPED_SHARE,
        help="exit with status 2 (after writing the whole output) when more than this share of the records is "
        "skipped, or every image (video) record is a missing_image (missing_video) skip; 1 accepts any loss",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="ours",
        help="ours: json + 0.jpg, 1.png...; bridge: json + pickled jpgs/videos (Megatron-Bridge ChatML)",
    )
    p.add_argument(
        "--media-store",
        choices=MEDIA_STORES,
        default=None,
        help="dedup (default; inline with --layout bridge): each distinct image / video (by the SHA-256 of its bytes) "
        "stored once, in the first record that uses it, later records referencing it (the loader reads it back); "
        "inline: a copy in every record that uses it (self-contained samples)",
    )
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default=None,
        help=f"--layout bridge only: the Qwen-VL preset whose video budget sizes the stored frames "
        f"(default {DEFAULT_BRIDGE_PRESET})",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="input format (auto: detected from the content; alpaca: instruction + output records)",
    )
    p.add_argument(
        "--preference",
        choices=PREFERENCE_MODES,
        default="refuse",
        help="preference records (DPO/ORPO/reward chosen/rejected pairs, LLaMA-Factory ranking): refuse: counted "
        "preference_data skips; chosen: written as the SFT record of their prompt and chosen answer",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes (0: in this process; defaults to the CPU count)",
    )
    p.add_argument("--samples-per-shard", type=int, default=1000, help="records per chunk; one shard per chunk")
    p.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default="header",
        help="header: PIL header read per image; decode: full decode (catches truncated images, slower)",
    )
    p.add_argument(
        "--allow-outside-paths",
        action="store_true",
        help="read image paths that resolve outside the source folder and --image-root (absolute paths, "
        "../, symlinks); by default they are path_outside_root skips",
    )
    p.add_argument(
        "--max-media-mb",
        type=float,
        default=DEFAULT_MAX_MEDIA_MB,
        help="largest image file read; larger ones are media_too_large skips",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous convert output in OUT (a folder convert did not write is never touched)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of a configuration error (default: a one-line message, exit status 2)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``energon-pack convert SOURCE OUT [...]``: 0 on success, 2 on a configuration error or a run that lost too
    much (a whole media kind, or more than ``--max-skipped-share`` of the records: the output is written whole)."""
    args = build_parser().parse_args(argv)
    try:
        summary = convert(
            args.source,
            args.out,
            image_root=args.image_root,
            layout=args.layout,
            format=args.format,
            samples_per_shard=args.samples_per_shard,
            workers=args.workers,
            progress=not args.no_progress,
            overwrite=args.overwrite,
            verify=args.verify,
            allow_outside_paths=args.allow_outside_paths,
            max_media_mb=args.max_media_mb,
            preset=args.preset,
            preference=args.preference,
            max_skipped_share=args.max_skipped_share,
            media_store=args.media_store,
        )
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"energon-pack convert: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.format_text())
    if summary.failed:  # written and summarised, but too much was lost for a script to carry on
        print(f"energon-pack convert: error: {summary.failed}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
