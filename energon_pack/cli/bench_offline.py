"""``energon-pack bench-offline``: offline packing side by side with Bridge's own (fill, packs, peak
RSS, wall time); its options live with the benchmark (``energon_pack.bench.offline_pack_bench``)."""

from __future__ import annotations

import argparse
from typing import Any

from .options import add_command

NAME = "bench-offline"
KNOB_FLAGS: dict[str, str] = {}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from energon_pack.bench.offline_pack_bench import add_arguments

    p = add_command(
        subparsers,
        NAME,
        "offline packing side by side with Bridge's tokenize_dataset + "
        "create_packing_strategy (first_fit_shuffle / first_fit_decreasing): fill, packs, peak RSS, "
        "wall time",
    )
    add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from energon_pack.bench.offline_pack_bench import run_cli

    return run_cli(args)
