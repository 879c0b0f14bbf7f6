"""``energon-pack make-demo DIR``: demo ChatML shards in a new or empty folder, prepared for Energon."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import CliError, index_files, refuse_remote_output
from .options import add_command, positive_int

NAME = "make-demo"
KNOB_FLAGS: dict[str, str] = {}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers, NAME, "write demo ChatML WebDataset shards into a new or empty folder and prepare them for Energon"
    )
    p.add_argument("dir", help="output folder (new, empty, or an earlier make-demo output)")
    p.add_argument("--samples", type=positive_int, default=1200, help="number of demo samples")
    p.add_argument("--seed", type=int, default=0, help="random seed (the same seed writes the same bytes)")
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.energon.demo_data import make_demo_shards

    refuse_remote_output(args.dir, "demo data")
    root = Path(args.dir)
    if root.is_file():
        raise CliError(f"{root} is a file: pass a new or empty folder")
    if root.is_dir():

        def ours(name: str) -> bool:
            return name == ".nv-meta" or (name.startswith("demo-") and name.endswith((".tar", ".tar.idx")))

        foreign = [p.name for p in root.iterdir() if not ours(p.name)]
        if foreign:
            raise CliError(
                f"{root} is not empty (it holds {', '.join(sorted(foreign)[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}): demo data goes into a new or empty folder"
            )
    make_demo_shards(root, args.samples, seed=args.seed)
    shards = sorted(p.name for p in root.glob("demo-*.tar"))
    print(f"wrote {args.samples} samples to {root}: {len(shards)} shard(s) {shards[0]} .. {shards[-1]}")
    print(f"wrote {root}/{index_files(len(shards))}")
    return 0
