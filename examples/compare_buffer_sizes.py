"""Compare packing_buffer_size values on your Energon dataset (default: the built-in demo shards).

For each K and both packing modes (``carry``: ours; ``rounds``: Energon's PackingDataset), it
streams packs through the real savable loader with W workers and records bin fill, samples
per pack, packs/s, samples/s, first-batch latency, peak worker RSS and skips. Writes
``buffer_sizes.json``, ``buffer_sizes.md`` and ``buffer_{fill,rss,latency}.png``.

    python examples/compare_buffer_sizes.py --data demo_data --buffers 1,4,8,16,32,64,128,256
"""

import argparse

from energon_pack.bench.buffer_sweep import DEFAULT_BUFFERS, main
from energon_pack.cli import ensure_demo_data


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="demo_data", help="Energon dataset folder; demo shards are written if absent")
    p.add_argument("--buffers", default=",".join(map(str, DEFAULT_BUFFERS)))
    p.add_argument("--modes", default="carry,rounds")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--packs", type=int, default=200, help="packs per cell; 0 streams one full epoch")
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--preset", default="qwen2.5-vl")
    p.add_argument("--out-dir", default="bench_results")
    p.add_argument("--no-plots", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    main(
        ensure_demo_data(args.data, 1200), args.out_dir, plots=not args.no_plots,
        buffers=[int(k) for k in args.buffers.split(",")], modes=args.modes.split(","), workers=args.workers,
        packs=args.packs or None, seq_length=args.width, preset=args.preset,
    )
