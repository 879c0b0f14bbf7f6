"""Compare packing_buffer_size values on your prepared Energon dataset (default: the demo shards).

For each K and both packing modes (``carry``: ours; ``rounds``: Energon's PackingDataset), it
streams packs through the real savable loader with W workers and records bin fill, samples
per pack, packs/s, samples/s, first-batch latency, peak worker RSS and skips. Writes
``buffer_sizes.json``, ``buffer_sizes.md`` and ``buffer_{fill,rss,latency,throughput}.png``
(the recommended K, the smallest K whose carry fill is within 0.5 points of the best, is marked).

The dataset must be prepared: ``energon-pack convert SOURCE OUT`` for JSON/JSONL/Parquet data,
``energon-pack prepare DIR`` for *.tar shards, ``energon-pack make-demo demo_data`` for demo data.
Nothing is ever written into ``--data``.

    python examples/compare_buffer_sizes.py --data demo_data --buffers 1,4,8,16,32,64,128,256
"""

import sys

from energon_pack.cli import main as cli_main


def main(argv=None) -> int:
    """The same sweep as ``energon-pack bench`` (same options, same one-line errors)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
